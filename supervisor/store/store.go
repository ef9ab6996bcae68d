// Package store is the daemon's audit log in SQLite (modernc.org/sqlite, pure Go):
// WAL, synchronous=FULL, one writer, versioned migrations. Every record carries the
// SHA-256 of the one before it, so an edited or deleted record breaks the chain and
// Verify finds it.
package store

import (
	"context"
	"crypto/sha256"
	"database/sql"
	"encoding/hex"
	"encoding/json"
	"errors"
	"fmt"
	"sync"
	"time"

	_ "modernc.org/sqlite" // registers the "sqlite" driver
)

// migrations are applied in order; PRAGMA user_version counts the applied ones.
var migrations = []string{
	`CREATE TABLE audit (
		seq       INTEGER PRIMARY KEY,
		time      TEXT NOT NULL,
		kind      TEXT NOT NULL,
		uid       INTEGER NOT NULL,
		run_id    TEXT NOT NULL DEFAULT '',
		detail    TEXT NOT NULL DEFAULT '{}',
		prev_hash TEXT NOT NULL,
		hash      TEXT NOT NULL
	)`,
	`CREATE INDEX audit_run ON audit(run_id)`,
	// The newest record removed by Prune: the chain now starts after it.
	`CREATE TABLE audit_anchor (
		id   INTEGER PRIMARY KEY CHECK (id = 1),
		seq  INTEGER NOT NULL,
		hash TEXT NOT NULL
	)`,
}

// genesis is the prev_hash of the first record.
const genesis = "0000000000000000000000000000000000000000000000000000000000000000"

// Event is one audit record. Detail holds the kind's fields (the code's SHA-256,
// limits, the outcome, the reason of a refusal ...), as JSON.
type Event struct {
	Seq    int64           `json:"seq"`
	Time   time.Time       `json:"time"`
	Kind   Kind            `json:"kind"`
	UID    int             `json:"uid"`
	RunID  string          `json:"run_id,omitempty"`
	Detail json.RawMessage `json:"detail"`
	Hash   string          `json:"hash"`
}

// ErrBroken is wrapped by Verify when the chain does not hold.
var ErrBroken = errors.New("store: audit chain broken")

// Store is an open audit log. Append is safe for concurrent use: one goroutine
// commits, and records appended while a commit is under way share the next one
// (group commit), so concurrent runs pay one fsync between them, not one each.
type Store struct {
	db   *sql.DB
	mu   sync.Mutex // the chain: last and seq, and the one writer
	last string     // hash of the newest record
	seq  int64

	qmu     sync.Mutex
	queue   []*pending // records waiting for the next commit
	closed  bool
	commits int64         // transactions committed (for tests)
	wake    chan struct{} // a record was queued (capacity 1)
	stop    chan struct{} // closed by Close
	stopped chan struct{} // closed by the committer when it returns
}

// pending is a record waiting for its commit, and where its outcome goes.
type pending struct {
	e    Event
	done chan error
}

// Open opens (creating if needed) the audit log at path and applies the migrations.
func Open(path string) (*Store, error) {
	db, err := sql.Open("sqlite", "file:"+path+"?_pragma=journal_mode(WAL)&_pragma=synchronous(FULL)&_pragma=busy_timeout(5000)")
	if err != nil {
		return nil, fmt.Errorf("store: %w", err)
	}
	db.SetMaxOpenConns(1) // SQLite allows one writer: serialise here, not on SQLITE_BUSY
	s := &Store{db: db, last: genesis, wake: make(chan struct{}, 1), stop: make(chan struct{}), stopped: make(chan struct{})}
	if err := s.migrate(); err != nil {
		db.Close()
		return nil, err
	}
	err = db.QueryRow(`SELECT seq, hash FROM audit ORDER BY seq DESC LIMIT 1`).Scan(&s.seq, &s.last)
	if err != nil && !errors.Is(err, sql.ErrNoRows) {
		db.Close()
		return nil, fmt.Errorf("store: %w", err)
	}
	go s.committer()
	return s, nil
}

// errClosed is the outcome of an append to a closed store.
var errClosed = errors.New("store: closed")

// committer writes the queued records, all that are queued in one transaction, until
// the store is closed; then it fails what is left.
func (s *Store) committer() {
	defer close(s.stopped)
	for {
		select {
		case <-s.wake:
		case <-s.stop:
			for _, p := range s.take() {
				p.done <- errClosed
			}
			return
		}
		for batch := s.take(); len(batch) > 0; batch = s.take() {
			s.commit(batch)
		}
	}
}

// take empties the queue and returns what it held.
func (s *Store) take() []*pending {
	s.qmu.Lock()
	defer s.qmu.Unlock()
	batch := s.queue
	s.queue = nil
	return batch
}

func (s *Store) migrate() error {
	var version int
	if err := s.db.QueryRow(`PRAGMA user_version`).Scan(&version); err != nil {
		return fmt.Errorf("store: %w", err)
	}
	if version > len(migrations) {
		return fmt.Errorf("store: the database is at schema %d, newer than this build's %d", version, len(migrations))
	}
	for i := version; i < len(migrations); i++ {
		tx, err := s.db.Begin()
		if err != nil {
			return fmt.Errorf("store: %w", err)
		}
		if _, err := tx.Exec(migrations[i]); err != nil {
			tx.Rollback()
			return fmt.Errorf("store: migration %d: %w", i+1, err)
		}
		if _, err := tx.Exec(fmt.Sprintf(`PRAGMA user_version = %d`, i+1)); err != nil {
			tx.Rollback()
			return fmt.Errorf("store: %w", err)
		}
		if err := tx.Commit(); err != nil {
			return fmt.Errorf("store: migration %d: %w", i+1, err)
		}
	}
	return nil
}

// Writable reports whether a record could be appended now: it takes the database's
// write lock (waiting up to the 5 s busy timeout) and gives it back, writing nothing.
// The error is SQLite's (SQLITE_BUSY while another process holds the lock).
func (s *Store) Writable(ctx context.Context) error {
	s.mu.Lock()
	defer s.mu.Unlock()
	conn, err := s.db.Conn(ctx)
	if err != nil {
		return fmt.Errorf("store: %w", err)
	}
	defer conn.Close()
	if _, err := conn.ExecContext(ctx, "BEGIN IMMEDIATE"); err != nil {
		return fmt.Errorf("store: %w", err)
	}
	if _, err := conn.ExecContext(ctx, "ROLLBACK"); err != nil {
		return fmt.Errorf("store: %w", err)
	}
	return nil
}

// Close closes the database.
func (s *Store) Close() error {
	s.qmu.Lock()
	already := s.closed
	s.closed = true
	s.qmu.Unlock()
	if !already {
		close(s.stop)
		<-s.stopped
	}
	return s.db.Close()
}

// hash is the SHA-256 over the previous hash and the record's fields, each
// length-prefixed so that no two records hash alike by shifting bytes between fields.
func hash(prev string, e Event) string {
	h := sha256.New()
	for _, f := range []string{prev, fmt.Sprint(e.Seq), e.Time.UTC().Format(time.RFC3339Nano), string(e.Kind),
		fmt.Sprint(e.UID), e.RunID, string(e.Detail)} {
		fmt.Fprintf(h, "%d:%s;", len(f), f)
	}
	return hex.EncodeToString(h.Sum(nil))
}

// Append writes e as the next record, durably (the transaction commits with
// synchronous=FULL before Append returns), and returns it with Seq and Hash set. An
// error means no record was written: the caller must not go on as if it had been.
// Records appended concurrently are written in one transaction, in the order they
// arrived; a failed transaction writes none of them, and each of their callers gets
// the error. A ctx already done is refused before the record is queued; once queued,
// Append waits for its commit's outcome, whatever ctx does.
func (s *Store) Append(ctx context.Context, e Event) (Event, error) {
	if len(e.Detail) == 0 {
		e.Detail = json.RawMessage(`{}`)
	}
	if !json.Valid(e.Detail) {
		return e, errors.New("store: detail is not JSON")
	}
	if err := ctx.Err(); err != nil {
		return e, err
	}
	p := &pending{e: e, done: make(chan error, 1)}
	s.qmu.Lock()
	if s.closed {
		s.qmu.Unlock()
		return e, errClosed
	}
	s.queue = append(s.queue, p)
	s.qmu.Unlock()
	select {
	case s.wake <- struct{}{}:
	default: // the committer is already woken
	}
	err := <-p.done
	return p.e, err
}

// commit writes batch in one transaction and tells each record's caller.
func (s *Store) commit(batch []*pending) {
	s.mu.Lock()
	defer s.mu.Unlock()
	fail := func(err error) {
		for _, p := range batch {
			p.done <- fmt.Errorf("store: append: %w", err)
		}
	}
	// A commit under way finishes whatever the callers' contexts do: its outcome
	// must reach every one of them.
	ctx := context.Background()
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		fail(err)
		return
	}
	seq, last := s.seq, s.last
	now := time.Now().UTC()
	for _, p := range batch {
		seq++
		p.e.Seq, p.e.Time = seq, now
		p.e.Hash = hash(last, p.e)
		if _, err := tx.ExecContext(ctx, `INSERT INTO audit (seq, time, kind, uid, run_id, detail, prev_hash, hash)
			VALUES (?, ?, ?, ?, ?, ?, ?, ?)`, p.e.Seq, p.e.Time.Format(time.RFC3339Nano), p.e.Kind, p.e.UID, p.e.RunID,
			string(p.e.Detail), last, p.e.Hash); err != nil {
			tx.Rollback()
			fail(err)
			return
		}
		last = p.e.Hash
	}
	if err := tx.Commit(); err != nil {
		fail(err)
		return
	}
	s.seq, s.last = seq, last
	s.qmu.Lock()
	s.commits++
	s.qmu.Unlock()
	for _, p := range batch {
		p.done <- nil
	}
}

// Prune removes the records older than before, oldest first, and keeps the newest
// removed record's seq and hash as the chain's anchor, so what remains still
// verifies. It returns how many records went and the seq of the last one removed.
// (Whoever can write the database can also prune it; the daemon records each prune
// as an event of the chain.)
func (s *Store) Prune(ctx context.Context, before time.Time) (n, through int64, err error) {
	s.mu.Lock()
	defer s.mu.Unlock()
	tx, err := s.db.BeginTx(ctx, nil)
	if err != nil {
		return 0, 0, fmt.Errorf("store: %w", err)
	}
	defer tx.Rollback()
	var hash string
	err = tx.QueryRowContext(ctx, `SELECT seq, hash FROM audit WHERE time < ? ORDER BY seq DESC LIMIT 1`,
		before.UTC().Format(time.RFC3339Nano)).Scan(&through, &hash)
	if errors.Is(err, sql.ErrNoRows) {
		return 0, 0, nil
	}
	if err != nil {
		return 0, 0, fmt.Errorf("store: %w", err)
	}
	res, err := tx.ExecContext(ctx, `DELETE FROM audit WHERE seq <= ?`, through)
	if err == nil {
		n, _ = res.RowsAffected()
		_, err = tx.ExecContext(ctx, `INSERT INTO audit_anchor (id, seq, hash) VALUES (1, ?, ?)
			ON CONFLICT (id) DO UPDATE SET seq = excluded.seq, hash = excluded.hash`, through, hash)
	}
	if err == nil {
		err = tx.Commit()
	}
	if err != nil {
		return 0, 0, fmt.Errorf("store: prune: %w", err)
	}
	return n, through, nil
}

// Verify walks the whole chain (from the anchor left by Prune, if any) and returns
// the number of records, or an error wrapping ErrBroken that names the first record
// that was edited, deleted or inserted. (Deleting the newest records leaves a
// shorter valid chain: compare the count or the newest hash with a copy kept
// elsewhere to detect that.)
func (s *Store) Verify(ctx context.Context) (int64, error) {
	prev, want := genesis, int64(1)
	var anchorSeq int64
	var anchorHash string
	err := s.db.QueryRowContext(ctx, `SELECT seq, hash FROM audit_anchor WHERE id = 1`).Scan(&anchorSeq, &anchorHash)
	switch {
	case err == nil:
		prev, want = anchorHash, anchorSeq+1
	case !errors.Is(err, sql.ErrNoRows):
		return 0, fmt.Errorf("store: %w", err)
	}
	first := want
	rows, err := s.db.QueryContext(ctx, `SELECT seq, time, kind, uid, run_id, detail, prev_hash, hash FROM audit ORDER BY seq`)
	if err != nil {
		return 0, fmt.Errorf("store: %w", err)
	}
	defer rows.Close()
	for rows.Next() {
		var e Event
		var t, detail, prevHash string
		if err := rows.Scan(&e.Seq, &t, &e.Kind, &e.UID, &e.RunID, &detail, &prevHash, &e.Hash); err != nil {
			return want - first, fmt.Errorf("store: %w", err)
		}
		e.Detail = json.RawMessage(detail)
		if e.Time, err = time.Parse(time.RFC3339Nano, t); err != nil {
			return want - first, fmt.Errorf("%w: record %d: bad time %q", ErrBroken, e.Seq, t)
		}
		switch {
		case e.Seq != want:
			return want - first, fmt.Errorf("%w: record %d is missing", ErrBroken, want)
		case prevHash != prev:
			return want - first, fmt.Errorf("%w: record %d does not follow record %d", ErrBroken, e.Seq, e.Seq-1)
		case hash(prev, e) != e.Hash:
			return want - first, fmt.Errorf("%w: record %d was changed", ErrBroken, e.Seq)
		}
		prev = e.Hash
		want++
	}
	if err := rows.Err(); err != nil {
		return want - first, fmt.Errorf("store: %w", err)
	}
	return want - first, nil
}

// Events returns up to limit records after seq after, oldest first, optionally only
// of one run.
func (s *Store) Events(ctx context.Context, after int64, runID string, limit int) ([]Event, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT seq, time, kind, uid, run_id, detail, hash FROM audit
		WHERE seq > ? AND (? = '' OR run_id = ?) ORDER BY seq LIMIT ?`, after, runID, runID, limit)
	if err != nil {
		return nil, fmt.Errorf("store: %w", err)
	}
	defer rows.Close()
	var out []Event
	for rows.Next() {
		var e Event
		var t, detail string
		if err := rows.Scan(&e.Seq, &t, &e.Kind, &e.UID, &e.RunID, &detail, &e.Hash); err != nil {
			return nil, fmt.Errorf("store: %w", err)
		}
		e.Time, _ = time.Parse(time.RFC3339Nano, t)
		e.Detail = json.RawMessage(detail)
		out = append(out, e)
	}
	return out, rows.Err()
}

// Unfinished returns the run.admitted records of the runs never finished or
// aborted, oldest first: after a crash of the daemon, the runs that were in flight
// (each record's UID and detail name who started it).
func (s *Store) Unfinished(ctx context.Context) ([]Event, error) {
	rows, err := s.db.QueryContext(ctx, `SELECT seq, time, kind, uid, run_id, detail, hash FROM audit
		WHERE kind = ? AND run_id NOT IN (SELECT run_id FROM audit WHERE kind IN (?, ?)) ORDER BY seq`,
		RunAdmitted, RunFinished, RunAborted)
	if err != nil {
		return nil, fmt.Errorf("store: %w", err)
	}
	defer rows.Close()
	var out []Event
	for rows.Next() {
		var e Event
		var t, detail string
		if err := rows.Scan(&e.Seq, &t, &e.Kind, &e.UID, &e.RunID, &detail, &e.Hash); err != nil {
			return nil, fmt.Errorf("store: %w", err)
		}
		e.Time, _ = time.Parse(time.RFC3339Nano, t)
		e.Detail = json.RawMessage(detail)
		out = append(out, e)
	}
	return out, rows.Err()
}
