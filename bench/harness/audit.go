package harness

import (
	"context"
	"encoding/json"
	"fmt"
	"path/filepath"
	"strings"

	"github.com/sandcell/sandcell/supervisor/store"
)

// Audit is a stopped (or killed) daemon's audit log, read from its state directory:
// the chain verified, the records counted by kind and each run's records by run id.
type Audit struct {
	// Records is the number of records the chain holds (store.Store.Verify); Chain
	// is Verify's error, nil when the chain holds.
	Records int64
	Chain   error
	// Kinds counts the records of each kind.
	Kinds map[store.Kind]int
	// Runs holds, for each run id, the count of its records of each kind.
	Runs map[string]map[store.Kind]int
	// Reasons is each finished run's reason (run.finished's detail).
	Reasons map[string]string
	// SQLHeld counts the approval.requested records of statements (writes held).
	SQLHeld int
}

// ReadAudit opens stateDir/audit.db (the daemon must not be running), verifies its
// chain and counts its records.
func ReadAudit(stateDir string) (*Audit, error) {
	st, err := store.Open(filepath.Join(stateDir, "audit.db"))
	if err != nil {
		return nil, err
	}
	defer st.Close()
	ctx := context.Background()
	a := &Audit{Kinds: map[store.Kind]int{}, Runs: map[string]map[store.Kind]int{}, Reasons: map[string]string{}}
	a.Records, a.Chain = st.Verify(ctx)
	for after := int64(0); ; {
		evs, err := st.Events(ctx, after, "", 5000)
		if err != nil {
			return nil, err
		}
		if len(evs) == 0 {
			return a, nil
		}
		for _, e := range evs {
			a.Kinds[e.Kind]++
			if e.Kind == store.ApprovalRequested && strings.Contains(string(e.Detail), `"db_sha256"`) {
				a.SQLHeld++
			}
			if e.RunID == "" {
				continue
			}
			if a.Runs[e.RunID] == nil {
				a.Runs[e.RunID] = map[store.Kind]int{}
			}
			a.Runs[e.RunID][e.Kind]++
			if e.Kind == store.RunFinished {
				var d struct{ Reason string }
				json.Unmarshal(e.Detail, &d)
				a.Reasons[e.RunID] = d.Reason
			}
		}
		after = evs[len(evs)-1].Seq
	}
}

// Consistent returns what breaks the catalog's pairing rules (store.Kind): every
// admitted run has exactly one run.finished or run.aborted, every accepted statement
// exactly one sql.finished, sql.refused, sql.failed or approval.requested, every cell
// exactly one session.cell_finished; and the chain holds.
func (a *Audit) Consistent() []string {
	var out []string
	if a.Chain != nil {
		out = append(out, fmt.Sprintf("the chain does not verify: %v", a.Chain))
	}
	for id, k := range a.Runs {
		if k[store.RunAdmitted] > 0 && k[store.RunFinished]+k[store.RunAborted] != 1 {
			out = append(out, fmt.Sprintf("run %s: %d finished, %d aborted records", id, k[store.RunFinished], k[store.RunAborted]))
		}
		if k[store.RunAdmitted] > 1 || k[store.RunRequested] > 1 {
			out = append(out, fmt.Sprintf("run %s: %d requested, %d admitted records", id, k[store.RunRequested], k[store.RunAdmitted]))
		}
	}
	if n, f := a.Kinds[store.SQLRequested], a.Kinds[store.SQLFinished]+a.Kinds[store.SQLRefused]+a.Kinds[store.SQLFailed]+a.SQLHeld; n > f {
		// A refusal before the checks passed is sql.refused without sql.requested, so
		// there may be more ends than requests, never fewer.
		out = append(out, fmt.Sprintf("%d statements requested, %d ended", n, f))
	}
	if n, f := a.Kinds[store.SessionCell], a.Kinds[store.SessionCellFinished]; n != f {
		out = append(out, fmt.Sprintf("%d cells requested, %d finished", n, f))
	}
	return out
}

// Admitted returns the ids of the runs with a run.admitted record.
func (a *Audit) Admitted() map[string]bool {
	out := map[string]bool{}
	for id, k := range a.Runs {
		if k[store.RunAdmitted] > 0 {
			out[id] = true
		}
	}
	return out
}
