package store

import (
	"context"
	"database/sql"
	"encoding/json"
	"errors"
	"fmt"
	"path/filepath"
	"strings"
	"sync"
	"testing"
	"time"

	_ "modernc.org/sqlite"
)

func TestAppendVerifyReopen(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "audit.db")
	s, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	var wg sync.WaitGroup
	for i := 0; i < 50; i++ {
		wg.Add(1)
		go func(i int) {
			defer wg.Done()
			if _, err := s.Append(ctx, Event{Kind: "run.requested", UID: 1000, RunID: fmt.Sprint("r", i),
				Detail: json.RawMessage(`{"code_sha256":"ab"}`)}); err != nil {
				t.Error(err)
			}
		}(i)
	}
	wg.Wait()
	if n, err := s.Verify(ctx); n != 50 || err != nil {
		t.Fatalf("verify: %d %v", n, err)
	}
	s.Close()
	// Reopened, the chain goes on from the newest record.
	s, err = Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if e, err := s.Append(ctx, Event{Kind: "run.finished", UID: 0}); err != nil || e.Seq != 51 {
		t.Fatalf("append after reopen: %+v %v", e, err)
	}
	if n, err := s.Verify(ctx); n != 51 || err != nil {
		t.Fatalf("verify after reopen: %d %v", n, err)
	}
	evs, err := s.Events(ctx, 0, "r7", 10)
	if err != nil || len(evs) != 1 || evs[0].RunID != "r7" {
		t.Fatalf("events: %+v %v", evs, err)
	}
}

// An edited, deleted or inserted record breaks the chain, and Verify says which.
func TestTamperDetected(t *testing.T) {
	ctx := context.Background()
	for _, tamper := range []struct{ name, sql, want string }{
		{"edit", `UPDATE audit SET detail = '{"code_sha256":"ff"}' WHERE seq = 3`, "record 3 was changed"},
		{"delete", `DELETE FROM audit WHERE seq = 3`, "record 3 is missing"},
		{"reorder", `UPDATE audit SET uid = 0 WHERE seq = 4`, "record 4 was changed"},
	} {
		path := filepath.Join(t.TempDir(), "audit.db")
		s, _ := Open(path)
		for i := 0; i < 5; i++ {
			s.Append(ctx, Event{Kind: "k", UID: 7, Detail: json.RawMessage(`{"code_sha256":"ab"}`)})
		}
		raw, _ := sql.Open("sqlite", path)
		if _, err := raw.Exec(tamper.sql); err != nil {
			t.Fatal(err)
		}
		raw.Close()
		_, err := s.Verify(ctx)
		if !errors.Is(err, ErrBroken) || !contains(err.Error(), tamper.want) {
			t.Errorf("%s: %v", tamper.name, err)
		}
		s.Close()
	}
}

func contains(s, sub string) bool { return strings.Contains(s, sub) }

func TestSchemaFromTheFuture(t *testing.T) {
	path := filepath.Join(t.TempDir(), "audit.db")
	raw, _ := sql.Open("sqlite", path)
	raw.Exec(`PRAGMA user_version = 99`)
	raw.Close()
	if _, err := Open(path); err == nil {
		t.Fatal("opened a newer schema")
	}
}

// Pruning old records keeps the rest verifiable, across a reopen; removing the anchor
// (to hide the pruning) breaks the chain.
func TestPrune(t *testing.T) {
	ctx := context.Background()
	path := filepath.Join(t.TempDir(), "audit.db")
	s, err := Open(path)
	if err != nil {
		t.Fatal(err)
	}
	for i := 0; i < 3; i++ {
		s.Append(ctx, Event{Kind: "old"})
	}
	time.Sleep(10 * time.Millisecond)
	cut := time.Now()
	for i := 0; i < 2; i++ {
		s.Append(ctx, Event{Kind: "new"})
	}
	if n, through, err := s.Prune(ctx, cut); n != 3 || through != 3 || err != nil {
		t.Fatalf("prune: %d %d %v", n, through, err)
	}
	if n, _, err := s.Prune(ctx, cut); n != 0 || err != nil {
		t.Fatalf("second prune: %d %v", n, err)
	}
	if n, err := s.Verify(ctx); n != 2 || err != nil {
		t.Fatalf("verify: %d %v", n, err)
	}
	s.Close()
	s, err = Open(path)
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	if e, err := s.Append(ctx, Event{Kind: "after"}); err != nil || e.Seq != 6 {
		t.Fatalf("append: %+v %v", e, err)
	}
	if n, err := s.Verify(ctx); n != 3 || err != nil {
		t.Fatalf("verify after reopen: %d %v", n, err)
	}
	s.db.Exec(`DELETE FROM audit_anchor`)
	if _, err := s.Verify(ctx); !errors.Is(err, ErrBroken) || !strings.Contains(err.Error(), "record 1 is missing") {
		t.Fatalf("anchor removed: %v", err)
	}
}

// Unfinished gives the run.admitted records (who started each run) of the runs with
// neither run.finished nor run.aborted.
func TestUnfinished(t *testing.T) {
	s, err := Open(filepath.Join(t.TempDir(), "audit.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	ctx := context.Background()
	for _, e := range []Event{
		{Kind: RunAdmitted, UID: -1, RunID: "a", Detail: json.RawMessage(`{"token":"alice"}`)},
		{Kind: RunAdmitted, UID: 1000, RunID: "b"},
		{Kind: RunAdmitted, UID: 1000, RunID: "c"},
		{Kind: RunFinished, UID: 1000, RunID: "b"},
		{Kind: RunAborted, UID: 1000, RunID: "c"},
	} {
		if _, err := s.Append(ctx, e); err != nil {
			t.Fatal(err)
		}
	}
	got, err := s.Unfinished(ctx)
	if err != nil || len(got) != 1 || got[0].RunID != "a" || got[0].UID != -1 || string(got[0].Detail) != `{"token":"alice"}` {
		t.Fatalf("%+v %v", got, err)
	}
}

// Concurrent appends share commits (one transaction, one fsync, for all that arrived
// while the previous one was being written): every record is written once, in a
// chain that verifies, in fewer transactions than records.
func TestGroupCommit(t *testing.T) {
	s, err := Open(filepath.Join(t.TempDir(), "audit.db"))
	if err != nil {
		t.Fatal(err)
	}
	defer s.Close()
	const n = 64
	var wg sync.WaitGroup
	seqs := make(chan int64, n)
	for i := 0; i < n; i++ {
		wg.Add(1)
		go func() {
			defer wg.Done()
			e, err := s.Append(context.Background(), Event{Kind: RunRequested, RunID: fmt.Sprint(i)})
			if err != nil {
				t.Error(err)
				return
			}
			seqs <- e.Seq
		}()
	}
	wg.Wait()
	close(seqs)
	seen := map[int64]bool{}
	for q := range seqs {
		if seen[q] || q < 1 || q > n {
			t.Fatalf("seq %d given twice or out of range", q)
		}
		seen[q] = true
	}
	if got, err := s.Verify(context.Background()); err != nil || got != n {
		t.Fatalf("verify: %d records, %v", got, err)
	}
	if s.commits >= n {
		t.Errorf("%d records took %d commits: none shared", n, s.commits)
	}
	t.Logf("%d concurrent records in %d commits", n, s.commits)
	// A cancelled caller's record is not written, and says so.
	ctx, cancel := context.WithCancel(context.Background())
	cancel()
	if _, err := s.Append(ctx, Event{Kind: RunRequested}); err == nil {
		t.Fatal("a cancelled append reported success")
	}
	if got, _ := s.Verify(context.Background()); got != n {
		t.Fatalf("%d records after a cancelled append", got)
	}
}

// BenchmarkAppend is one durable record at a time (a commit, an fsync, each), and
// eight appending at once (sharing commits).
func BenchmarkAppend(b *testing.B) {
	s, err := Open(filepath.Join(b.TempDir(), "audit.db"))
	if err != nil {
		b.Fatal(err)
	}
	defer s.Close()
	b.Run("sequential", func(b *testing.B) {
		for i := 0; i < b.N; i++ {
			if _, err := s.Append(context.Background(), Event{Kind: RunRequested}); err != nil {
				b.Fatal(err)
			}
		}
	})
	b.Run("concurrent8", func(b *testing.B) {
		b.SetParallelism(4) // 4 x GOMAXPROCS(2) goroutines
		b.RunParallel(func(pb *testing.PB) {
			for pb.Next() {
				if _, err := s.Append(context.Background(), Event{Kind: RunRequested}); err != nil {
					b.Error(err)
				}
			}
		})
	})
}
