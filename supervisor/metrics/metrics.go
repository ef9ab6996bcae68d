// Package metrics is the daemon's Prometheus metrics (see Set): runs by reason
// and duration, the queue and the pool, what runs and approvals keep, sessions'
// failed pauses, guests' tool calls. It reads the run manager, the sessions, the
// approval queue and the tool broker; none of them imports it.
package metrics

import (
	"github.com/prometheus/client_golang/prometheus"
	"github.com/prometheus/client_golang/prometheus/collectors"

	"github.com/sandcell/sandcell/sandbox/protocol"
	"github.com/sandcell/sandcell/supervisor/approvals"
	"github.com/sandcell/sandcell/supervisor/runs"
	"github.com/sandcell/sandcell/supervisor/sessions"
	"github.com/sandcell/sandcell/supervisor/toolbroker"
	"github.com/sandcell/sandcell/supervisor/wire"
)

// Set are the daemon's Prometheus metrics, in base units with the sandcell_
// prefix:
//
//	sandcell_runs_total{reason}        counter: finished runs by termination reason
//	sandcell_run_duration_seconds      histogram: wall time of finished runs, queueing included
//	sandcell_queue_depth               gauge: runs waiting for a worker
//	sandcell_workers_busy              gauge: workers running now
//	sandcell_kept_bytes{runs}          gauge: bytes kept for callers (output, event records) of "finished" and "running" runs
//	sandcell_kept_bytes_max            gauge: the budget of what is kept (runs.max_retained_output_bytes)
//	sandcell_approvals_kept_bytes      gauge: bytes the approvals keep (approvals.MaxKeptBytes at most; see CountApprovals)
//	sandcell_session_pause_failures_total{reason}  counter: pauses of sessions that failed, by reason (see CountSessions)
//	sandcell_tool_calls_total{decision}  counter: guests' tool calls by decision (see CountTools)
//	sandcell_build_info{version,revision} gauge, always 1
//
// plus the Go runtime's and the process's standard collectors.
type Set struct {
	Registry *prometheus.Registry
	runs     *prometheus.CounterVec
	duration prometheus.Histogram
}

// New registers the metrics of m.
func New(m *runs.Manager, version, revision string) *Set {
	x := &Set{
		Registry: prometheus.NewRegistry(),
		runs: prometheus.NewCounterVec(prometheus.CounterOpts{Name: "sandcell_runs_total",
			Help: "Finished runs by termination reason."}, []string{"reason"}),
		duration: prometheus.NewHistogram(prometheus.HistogramOpts{Name: "sandcell_run_duration_seconds",
			Help:    "Wall time of finished runs, from admission to the final state.",
			Buckets: []float64{.005, .01, .025, .05, .1, .25, .5, 1, 2.5, 5, 10, 30, 60, 300, 600}}),
	}
	for _, r := range protocol.Reasons() {
		x.runs.WithLabelValues(string(r)) // every reason present from the start, at 0
	}
	build := prometheus.NewGauge(prometheus.GaugeOpts{Name: "sandcell_build_info",
		Help: "Build of this daemon (always 1).", ConstLabels: prometheus.Labels{"version": version, "revision": revision}})
	build.Set(1)
	x.Registry.MustRegister(x.runs, x.duration, build,
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "sandcell_queue_depth", Help: "Runs waiting for a worker."},
			func() float64 { _, q := m.Busy(); return float64(q) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "sandcell_workers_busy", Help: "Workers running now."},
			func() float64 { r, _ := m.Busy(); return float64(r) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "sandcell_kept_bytes", Help: "Bytes kept for callers (output and event records), of finished or running runs.",
			ConstLabels: prometheus.Labels{"runs": "finished"}}, func() float64 { f, _, _ := m.Kept(); return float64(f) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "sandcell_kept_bytes", Help: "Bytes kept for callers (output and event records), of finished or running runs.",
			ConstLabels: prometheus.Labels{"runs": "running"}}, func() float64 { _, r, _ := m.Kept(); return float64(r) }),
		prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "sandcell_kept_bytes_max", Help: "The budget of bytes kept for callers (runs.max_retained_output_bytes)."},
			func() float64 { _, _, x := m.Kept(); return float64(x) }),
		collectors.NewGoCollector(), collectors.NewProcessCollector(collectors.ProcessCollectorOpts{}))
	m.OnFinish(x.observe)
	return x
}

// CountApprovals adds sandcell_approvals_kept_bytes, what a keeps.
func (x *Set) CountApprovals(a *approvals.Queue) {
	x.Registry.MustRegister(prometheus.NewGaugeFunc(prometheus.GaugeOpts{Name: "sandcell_approvals_kept_bytes",
		Help: "Bytes the approvals keep (their subjects as JSON), at most approvals.MaxKeptBytes."},
		func() float64 { return float64(a.KeptBytes()) }))
}

// CountSessions adds sandcell_session_pause_failures_total{reason}, the pauses of
// s's sessions that failed: "bound" (the checkpoint would pass its caller's
// sessions.max_paused_bytes_per_caller), "write" (it could not be written: the
// state file system full or failing), "lost" (the worker could not give it).
func (x *Set) CountSessions(s *sessions.Manager) {
	for _, reason := range sessions.PauseFailureReasons() {
		x.Registry.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "sandcell_session_pause_failures_total",
			Help:        "Pauses of interpreter sessions that failed, by reason (the session stays live, or is lost for \"lost\").",
			ConstLabels: prometheus.Labels{"reason": reason}}, func() float64 { return float64(s.PauseFailures(reason)) }))
	}
}

// CountTools adds sandcell_tool_calls_total{decision}, the guests' tool calls b
// decided, by decision (toolbroker.Decisions).
func (x *Set) CountTools(b *toolbroker.Broker) {
	for _, d := range toolbroker.Decisions() {
		x.Registry.MustRegister(prometheus.NewCounterFunc(prometheus.CounterOpts{Name: "sandcell_tool_calls_total",
			Help:        "Guests' tool calls, by what became of them (see the tool.called audit records).",
			ConstLabels: prometheus.Labels{"decision": d}}, func() float64 { return float64(b.Calls(d)) }))
	}
}

func (x *Set) observe(r *runs.Run, v wire.View) {
	if r.Job != runs.JobRun || v.Result == nil || v.FinishedAt == nil {
		return
	}
	x.runs.WithLabelValues(string(v.Result.Reason)).Inc()
	x.duration.Observe(v.FinishedAt.Sub(v.CreatedAt).Seconds())
}
