// Package drill runs a drill against a running flashsale: a timeline of
// load phases (open loop, each at its own rate) with faults injected at
// named moments as shell commands, then grades the run against the pass
// criteria of the same file: each quiet phase's p99, an error budget over
// the whole drill, the recovery time after each fault, and the invariants,
// read from the database and Redis once the load is over. docs/drills.md
// describes the file and the grading.
package drill

import (
	"bytes"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"strings"
	"time"
)

// Duration is a time.Duration written as a Go duration string ("10s").
type Duration time.Duration

// UnmarshalJSON reads "1m30s"-style strings.
func (d *Duration) UnmarshalJSON(b []byte) error {
	var s string
	if err := json.Unmarshal(b, &s); err != nil {
		return errors.New(`a duration is a string such as "10s" or "1m30s"`)
	}
	v, err := time.ParseDuration(s)
	if err != nil {
		return fmt.Errorf("duration %q: want a string such as \"10s\" or \"1m30s\"", s)
	}
	*d = Duration(v)
	return nil
}

// MarshalJSON writes the duration as a string.
func (d Duration) MarshalJSON() ([]byte, error) { return json.Marshal(time.Duration(d).String()) }

// D is d as a time.Duration.
func (d Duration) D() time.Duration { return time.Duration(d) }

// File is a drill: what it sells, its phases, its faults, how it is graded.
type File struct {
	Name string `json:"name"`
	// Scenario is the buyers' behaviour (loadgen scenarios: hot, many,
	// mix, purchase); default hot.
	Scenario     string `json:"scenario"`
	Stock        int64  `json:"stock"`          // units on sale (default 1,000,000)
	SKUs         int    `json:"skus"`           // scenario many: how many SKUs
	PerUserLimit int64  `json:"per_user_limit"` // default 1
	// MaxInFlight bounds the requests in flight (default 4,000): past it a
	// due request waits, and its wait counts in its latency.
	MaxInFlight int     `json:"max_in_flight"`
	Phases      []Phase `json:"phases"`
	Faults      []Fault `json:"faults"`
	Pass        Pass    `json:"pass"`
}

// Phase is a stretch of the timeline at one rate.
type Phase struct {
	Name string   `json:"name"`
	Rate float64  `json:"rate"` // requests per second (open loop)
	For  Duration `json:"for"`
}

// Fault is a shell command run at a moment of the drill.
type Fault struct {
	Name string   `json:"name"`
	At   Duration `json:"at"`  // from the start of the first phase
	Run  string   `json:"run"` // run by sh -c; a non-zero exit is reported, not fatal
	// Timeout bounds the command (default 60s); it is killed past it.
	Timeout Duration `json:"timeout"`
}

// Pass is what the drill must show.
type Pass struct {
	// P99 bounds the p99 latency of every phase in which no fault was
	// injected and from which no fault's recovery spilled over (0: not
	// graded).
	P99 Duration `json:"p99"`
	// ErrorBudget is the largest share of requests answered with an error
	// (a 5xx, no answer, a refusal that is not a business answer) over the
	// whole drill, and the share a second may have to count as recovered
	// (default 0.01).
	ErrorBudget *float64 `json:"error_budget"`
	// RecoverWithin bounds each fault's recovery time (0: not graded).
	RecoverWithin Duration `json:"recover_within"`
}

// Budget is the error budget with its default.
func (p Pass) Budget() float64 {
	if p.ErrorBudget == nil {
		return 0.01
	}
	return *p.ErrorBudget
}

// Parse reads and checks a drill file: unknown fields, a missing phase, a
// fault outside the timeline are errors that name the field.
func Parse(r io.Reader) (*File, error) {
	raw, err := io.ReadAll(r)
	if err != nil {
		return nil, err
	}
	dec := json.NewDecoder(bytes.NewReader(raw))
	dec.DisallowUnknownFields()
	var f File
	if err := dec.Decode(&f); err != nil {
		return nil, fmt.Errorf("drill file: %w", err)
	}
	if dec.More() {
		return nil, errors.New("drill file: more than one JSON value")
	}
	if f.Scenario == "" {
		f.Scenario = "hot"
	}
	if f.Stock == 0 {
		f.Stock = 1_000_000
	}
	if f.PerUserLimit == 0 {
		f.PerUserLimit = 1
	}
	if f.MaxInFlight == 0 {
		f.MaxInFlight = 4000
	}
	for i := range f.Faults {
		if f.Faults[i].Timeout == 0 {
			f.Faults[i].Timeout = Duration(time.Minute)
		}
	}
	return &f, f.validate()
}

func (f *File) validate() error {
	var errs []string
	bad := func(format string, args ...any) { errs = append(errs, fmt.Sprintf(format, args...)) }
	switch f.Scenario {
	case "hot", "many", "mix", "purchase":
	default:
		bad("scenario %q: one of hot, many, mix, purchase", f.Scenario)
	}
	if f.Stock < 1 {
		bad("stock must be at least 1")
	}
	if f.Scenario == "many" && f.SKUs < 1 {
		bad("scenario many needs skus of at least 1")
	}
	if f.PerUserLimit < 1 {
		bad("per_user_limit must be at least 1")
	}
	if f.MaxInFlight < 1 {
		bad("max_in_flight must be at least 1")
	}
	if len(f.Phases) == 0 {
		bad("phases: at least one phase is needed")
	}
	names := map[string]bool{}
	for i, p := range f.Phases {
		switch {
		case p.Name == "":
			bad("phases[%d]: a name is needed", i)
		case names[p.Name]:
			bad("phases[%d]: the name %q is used twice", i, p.Name)
		}
		names[p.Name] = true
		if !(p.Rate > 0 && p.Rate <= 1e7) {
			bad("phases[%d] (%s): rate must be in (0, 1e7] requests per second", i, p.Name)
		}
		if p.For.D() < time.Second {
			bad("phases[%d] (%s): for must be at least 1s", i, p.Name)
		}
	}
	total := f.Length()
	for i, ft := range f.Faults {
		switch {
		case ft.Name == "":
			bad("faults[%d]: a name is needed", i)
		case strings.TrimSpace(ft.Run) == "":
			bad("faults[%d] (%s): run: a shell command is needed", i, ft.Name)
		case ft.At.D() < 0 || ft.At.D() >= total:
			bad("faults[%d] (%s): at %v is outside the drill's %v", i, ft.Name, ft.At.D(), total)
		case ft.Timeout.D() <= 0:
			bad("faults[%d] (%s): timeout must be positive", i, ft.Name)
		}
	}
	if b := f.Pass.Budget(); !(b >= 0 && b < 1) {
		bad("pass.error_budget must be in [0, 1)")
	}
	if f.Pass.P99 < 0 || f.Pass.RecoverWithin < 0 {
		bad("pass: durations must not be negative")
	}
	if len(errs) > 0 {
		return fmt.Errorf("drill file: %s", strings.Join(errs, "; "))
	}
	return nil
}

// Length is the sum of the phases.
func (f *File) Length() time.Duration {
	var d time.Duration
	for _, p := range f.Phases {
		d += p.For.D()
	}
	return d
}
