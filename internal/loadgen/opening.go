package loadgen

import (
	"context"
	"encoding/json"
	"errors"
	"fmt"
	"io"
	"math"
	"math/rand/v2"
	"net/http"
	"slices"
	"strconv"
	"sync"
	"sync/atomic"
	"time"

	"github.com/flashsale/flashsale/internal/altcha"
)

// Opening is the scenario of a sale's opening (issue 23 §5): people who
// solve the proof of work, join the waiting room, poll it as told and buy
// once admitted (some never come back), and bots that hammer the purchase
// without proof or get proofs at machine speed and poll as fast as they
// can. Its figures are OpeningFigures; the invariants are checked from the
// database as after every run.
const Opening = "opening"

// OpeningConfig describes an opening.
type OpeningConfig struct {
	People int
	// Bots are bot accounts: half buy directly without ticket or admission
	// in a loop, half solve proofs and join at the opening, polling
	// without pause.
	Bots int
	// BotRate is each direct bot's purchases a second (0: a tight loop,
	// as fast as the answers come).
	BotRate float64
	// NoReturn is the share of people who never come back once admitted.
	NoReturn float64
	// Early is how long before the opening people start arriving; they
	// arrive uniformly from Early before to one second after it.
	Early time.Duration
	Stock int64
	// Patience bounds the run: people still waiting this long after the
	// opening give up.
	Patience time.Duration
	// ServerPID is the server's process when it is not this one (0: in-process).
	ServerPID int
	RunID     string
}

// Validate checks c.
func (c OpeningConfig) Validate() error {
	switch {
	case c.People < 1 || c.People > 100000:
		return errors.New("-people must be 1..100000")
	case c.Bots < 0 || c.Bots > 10000:
		return errors.New("-bots must be 0..10000")
	case c.NoReturn < 0 || c.NoReturn > 1:
		return errors.New("-no-return must be in [0, 1]")
	case c.Early < 0 || c.Early > 10*time.Minute:
		return errors.New("-early must be in [0, 10m]")
	case c.BotRate < 0:
		return errors.New("-bot-rate must be 0 or more")
	case c.Stock < 1:
		return errors.New("stock must be at least 1")
	case c.Patience <= 0:
		return errors.New("the run needs a time bound")
	case c.RunID == "":
		return errors.New("a run id is required")
	}
	return nil
}

// solveLimit bounds a solve: far above the most work a challenge asks.
const solveLimit = 1 << 22

// OpeningRun is one run of the opening; Setup, then Run.
type OpeningRun struct {
	cfg     OpeningConfig
	sku     string
	opensAt time.Time

	mu       sync.Mutex
	accepted map[string]bool
}

// NewOpening validates cfg and names the sale.
func NewOpening(cfg OpeningConfig) (*OpeningRun, error) {
	if err := cfg.Validate(); err != nil {
		return nil, err
	}
	return &OpeningRun{cfg: cfg, sku: "opening-" + cfg.RunID, accepted: map[string]bool{}}, nil
}

// SKU returns the sale's id.
func (o *OpeningRun) SKU() string { return o.sku }

// Accepted returns the distinct order ids the service accepted, by SKU.
func (o *OpeningRun) Accepted() map[string][]string {
	o.mu.Lock()
	defer o.mu.Unlock()
	ids := make([]string, 0, len(o.accepted))
	for id := range o.accepted {
		ids = append(ids, id)
	}
	return map[string][]string{o.sku: ids}
}

func (o *OpeningRun) accept(id string) {
	o.mu.Lock()
	o.accepted[id] = true
	o.mu.Unlock()
}

// Setup creates the sale: Stock units, one per buyer, tickets required
// (challenges handed out from now), a waiting room, opening Early from now.
func (o *OpeningRun) Setup(ctx context.Context, c *Client) error {
	now := time.Now().UTC()
	o.opensAt = now.Add(o.cfg.Early + 200*time.Millisecond).Truncate(time.Millisecond)
	body := fmt.Sprintf(`{"stock":%d,"per_user_limit":1,"ticket_required":true,"waiting_room":true,"tickets_open_at":%q,"starts_at":%q}`,
		o.cfg.Stock, now.Add(-time.Second).Format(time.RFC3339Nano), o.opensAt.Format(time.RFC3339Nano))
	return c.PutSale(ctx, o.sku, []byte(body))
}

// CloseRoom takes the tickets and the room off the sale, so that the
// checks after the run (I7) can buy what is left as fresh buyers, and
// waits until the buyers' view of the sale says so.
func (o *OpeningRun) CloseRoom(ctx context.Context, c *Client) error {
	if err := c.PatchSale(ctx, o.sku, []byte(`{"ticket_required":false,"waiting_room":false}`)); err != nil {
		return err
	}
	var last []byte
	for start := time.Now(); time.Since(start) < 10*time.Second; {
		var v struct {
			Tickets bool `json:"ticket_required"`
			Room    bool `json:"waiting_room"`
		}
		r, raw := c.doRaw(ctx, http.MethodGet, "/api/v1/skus/"+o.sku, "", nil)
		last = raw
		if r.Status == http.StatusOK && json.Unmarshal(raw, &v) == nil && !v.Tickets && !v.Room {
			return nil
		}
		if !pause(ctx, 50*time.Millisecond) {
			return ctx.Err()
		}
	}
	return fmt.Errorf("loadgen: %s still has its room or tickets 10s after they were taken off: %s", o.sku, last)
}

// buyer is what one person or room bot did.
type buyer struct {
	bot      bool
	noReturn bool
	arrival  time.Time
	joined   time.Time
	// predicted is the admission time the first ETA promised (zero: none).
	predicted time.Time
	admitted  time.Time
	end       time.Time // the last answer (admitted, sold out, gave up)
	polls     int64
	solveCPU  time.Duration
	solveWall time.Duration
	tries     uint32
	outcome   string
}

// Run runs the opening against c and returns its figures (the invariant
// checks are the caller's, with Accepted).
func (o *OpeningRun) Run(ctx context.Context, c *Client) (*OpeningFigures, error) {
	if o.opensAt.IsZero() {
		return nil, errors.New("loadgen: opening: Setup first")
	}
	deadline := o.opensAt.Add(o.cfg.Patience)
	rctx, cancel := context.WithDeadline(ctx, deadline.Add(10*time.Second))
	defer cancel()

	people := make([]*buyer, o.cfg.People)
	first := o.opensAt.Add(-o.cfg.Early)
	span := o.cfg.Early + time.Second
	rng := rand.New(rand.NewPCG(uint64(time.Now().UnixNano()), 23))
	for i := range people {
		people[i] = &buyer{arrival: first.Add(time.Duration(rng.Int64N(int64(span)))), noReturn: rng.Float64() < o.cfg.NoReturn}
	}
	roomBots := make([]*buyer, o.cfg.Bots-o.cfg.Bots/2)
	for i := range roomBots {
		roomBots[i] = &buyer{bot: true, arrival: o.opensAt}
	}
	direct := directBots{codes: map[string]int64{}}

	cpu0 := sampleCPU()
	var wg sync.WaitGroup
	for i, p := range people {
		wg.Go(func() { o.person(rctx, c, "p-"+o.cfg.RunID+"-"+strconv.Itoa(i), p, deadline) })
	}
	for i, b := range roomBots {
		wg.Go(func() { o.person(rctx, c, "rb-"+o.cfg.RunID+"-"+strconv.Itoa(i), b, deadline) })
	}
	peopleDone := make(chan struct{})
	var dwg sync.WaitGroup
	for i := range o.cfg.Bots / 2 {
		dwg.Go(func() { o.directBot(rctx, c, "db-"+o.cfg.RunID+"-"+strconv.Itoa(i), &direct, peopleDone) })
	}
	wg.Wait()
	close(peopleDone)
	dwg.Wait()
	cpu := cpuBetween(cpu0, sampleCPU(), o.cfg.ServerPID)
	if err := ctx.Err(); err != nil {
		return nil, err
	}
	return o.figures(people, roomBots, &direct, cpu), nil
}

// pause sleeps d or until ctx ends; false if ctx ended.
func pause(ctx context.Context, d time.Duration) bool {
	t := time.NewTimer(d)
	defer t.Stop()
	select {
	case <-ctx.Done():
		return false
	case <-t.C:
		return true
	}
}

// person is one buyer's visit: arrive, get a ticket, join, poll as told
// (a room bot: without pause), buy once admitted.
func (o *OpeningRun) person(ctx context.Context, c *Client, user string, b *buyer, deadline time.Time) {
	defer func() { b.end = time.Now() }()
	if !pause(ctx, time.Until(b.arrival)) {
		b.outcome = "gave_up"
		return
	}
	tk, code := o.ticket(ctx, c, user, b)
	if tk == "" {
		b.outcome = code
		return
	}
	var st QueueStatus
	var r Reply
	for {
		st, r = c.Queue(ctx, user, o.sku, tk, true)
		if !retryable(r) || time.Now().After(deadline) || !pause(ctx, 200*time.Millisecond) {
			break
		}
	}
	if r.Status != 201 && r.Status != 200 {
		b.outcome = "join:" + r.Code
		return
	}
	b.joined = time.Now()
	for {
		now := time.Now()
		if st.State == "waiting" && b.predicted.IsZero() && st.ETASeconds != nil && *st.ETASeconds >= 0 && st.Position != nil && *st.Position > 0 {
			b.predicted = now.Add(time.Duration(*st.ETASeconds * float64(time.Second)))
		}
		switch st.State {
		case "admitted":
			b.admitted = now
			if b.noReturn {
				b.outcome = "no_return"
				return
			}
			b.outcome = o.buy(ctx, c, user, tk, st.Admission, deadline)
			return
		case "sold_out", "expired":
			b.outcome = st.State
			return
		}
		if now.After(deadline) {
			b.outcome = "gave_up"
			return
		}
		wait := time.Second // no poll_after: a browser's default
		if st.PollAfterMS != nil {
			wait = time.Duration(*st.PollAfterMS) * time.Millisecond
		}
		if b.bot {
			wait = 5 * time.Millisecond // hammering, poll_after ignored
		}
		if !pause(ctx, wait) {
			b.outcome = "gave_up"
			return
		}
		b.polls++
		if st2, r := c.Queue(ctx, user, o.sku, "", false); !retryable(r) && r.Status == 200 {
			st = st2
		}
	}
}

// ticket gets user a ticket: a challenge, solved as a browser (or a bot)
// does, redeemed; retried after a pause on 429 and 5xx. It returns "" and
// the refusal's code if refused.
func (o *OpeningRun) ticket(ctx context.Context, c *Client, user string, b *buyer) (string, string) {
	for try := 0; try < 20; try++ {
		body, r := c.Challenge(ctx, user, o.sku)
		if r.Status == 200 {
			var payload string
			var err error
			start := time.Now()
			b.solveCPU += threadCPU(func() { payload, b.tries, err = altcha.Solve(body, solveLimit) })
			b.solveWall += time.Since(start)
			if err != nil {
				return "", "solve_failed"
			}
			tk, r := c.Ticket(ctx, user, o.sku, payload)
			if tk != "" {
				return tk, ""
			}
			if !retryable(r) {
				return "", "ticket:" + r.Code
			}
		} else if !retryable(r) {
			return "", "challenge:" + r.Code
		}
		if !pause(ctx, time.Duration(200+rand.IntN(300))*time.Millisecond) {
			break
		}
	}
	return "", "no_ticket"
}

// buy buys once with the admission, retrying what decided nothing with
// the same Idempotency-Key.
func (o *OpeningRun) buy(ctx context.Context, c *Client, user, tk, admission string, deadline time.Time) string {
	for {
		r := c.BuyAdmitted(ctx, user, o.sku, "open-1", tk, admission)
		if r.Status == 202 && r.OrderID != "" {
			o.accept(r.OrderID)
			return "bought"
		}
		if !retryable(r) || time.Now().After(deadline) || !pause(ctx, 50*time.Millisecond) {
			return "buy:" + r.Code
		}
	}
}

type directBots struct {
	mu       sync.Mutex
	codes    map[string]int64
	requests atomic.Int64
	units    atomic.Int64
}

// directBot buys without ticket or admission, BotRate a second (or in a
// tight loop), a new Idempotency-Key each time, until the people are done.
func (o *OpeningRun) directBot(ctx context.Context, c *Client, user string, d *directBots, done <-chan struct{}) {
	var every time.Duration
	if o.cfg.BotRate > 0 {
		every = time.Duration(float64(time.Second) / o.cfg.BotRate)
	}
	next := time.Now()
	for n := 0; ; n++ {
		if every > 0 {
			next = next.Add(every)
			pause(ctx, time.Until(next))
		}
		select {
		case <-done:
			return
		case <-ctx.Done():
			return
		default:
		}
		r := c.BuyAdmitted(ctx, user, o.sku, "bot-"+strconv.Itoa(n), "", "")
		d.requests.Add(1)
		if r.Status == 202 && r.OrderID != "" {
			o.accept(r.OrderID)
			d.units.Add(1)
		}
		d.mu.Lock()
		d.codes[r.Code]++
		d.mu.Unlock()
		if r.Status == 0 { // no answer: do not spin on a dead socket
			pause(ctx, 10*time.Millisecond)
		}
	}
}

// OpeningFigures are what an opening measured.
type OpeningFigures struct {
	People        int     `json:"people"`
	Bots          int     `json:"bots"` // accounts: half direct, half through the room
	NoReturnShare float64 `json:"no_return_share"`
	EarlyS        float64 `json:"early_s"`
	// Units: the distinct orders accepted (the checks hold the database
	// to them), those of people and those of bots by path.
	Units          int64   `json:"units"`
	PeopleUnits    int64   `json:"people_units"`
	PeopleShare    float64 `json:"people_share"` // of Units
	BotDirectUnits int64   `json:"bot_direct_units"`
	BotRoomUnits   int64   `json:"bot_room_units"`
	// BotDirectRequests are the direct bots' purchases, by answer.
	BotDirectRequests int64            `json:"bot_direct_requests"`
	BotDirectCodes    map[string]int64 `json:"bot_direct_codes"`
	// PeopleOutcomes counts people by how their visit ended: bought,
	// no_return, sold_out, expired, gave_up, or the refusal's code.
	PeopleOutcomes map[string]int `json:"people_outcomes"`
	BotOutcomes    map[string]int `json:"room_bot_outcomes"`
	PeopleAdmitted int            `json:"people_admitted"`
	// LastUnitS is when the last unit was bought, after the opening.
	LastUnitS    float64 `json:"last_unit_s"`
	BotsAdmitted int     `json:"room_bots_admitted"`
	// Fairness is Spearman's rank correlation between arrival and
	// admission of the admitted people who joined after the opening (first
	// come first served: near 1); FairnessPreOpen the same for those who
	// joined before it (a lottery: near 0). Null with fewer than 3.
	Fairness        *float64 `json:"fairness_after_open"`
	FairnessN       int      `json:"fairness_after_open_n"`
	FairnessPreOpen *float64 `json:"fairness_pre_open"`
	FairnessPreN    int      `json:"fairness_pre_open_n"`
	// PollsPerWaitingS is the people's polls over their seconds in the
	// queue (join to their last answer); BotPollsPerWaitingS the room bots'.
	PeoplePolls         int64   `json:"people_polls"`
	PeopleWaitingS      float64 `json:"people_waiting_s"`
	PollsPerWaitingS    float64 `json:"polls_per_waiting_buyer_s"`
	BotPollsPerWaitingS float64 `json:"room_bot_polls_per_waiting_bot_s"`
	// ETA error: |actual − predicted admission| of admitted people who
	// were given an ETA, in seconds.
	ETAErrorN   int     `json:"eta_error_n"`
	ETAErrorP50 float64 `json:"eta_error_p50_s"`
	ETAErrorP90 float64 `json:"eta_error_p90_s"`
	// Solves: derivations per solve and the CPU one took in this process
	// (people's and room bots').
	SolveTriesMean float64 `json:"solve_tries_mean"`
	SolveCPUMsP50  float64 `json:"solve_cpu_ms_p50"`
	SolveCPUMsP90  float64 `json:"solve_cpu_ms_p90"`
	// Server CPU over the run (first arrival to the last visit's end) per
	// admitted buyer (people and room bots). CPUBasis says how the server's
	// share was found.
	RunS                   float64 `json:"run_s"`
	ServerCPUS             float64 `json:"server_cpu_s"`
	ServerCPUMsPerAdmitted float64 `json:"server_cpu_ms_per_admitted"`
	CPUBasis               string  `json:"cpu_basis"`
}

func (o *OpeningRun) figures(people, bots []*buyer, d *directBots, cpu CPU) *OpeningFigures {
	f := &OpeningFigures{People: o.cfg.People, Bots: o.cfg.Bots, NoReturnShare: o.cfg.NoReturn, EarlyS: o.cfg.Early.Seconds(),
		PeopleOutcomes: map[string]int{}, BotOutcomes: map[string]int{}, BotDirectCodes: map[string]int64{}}
	o.mu.Lock()
	f.Units = int64(len(o.accepted))
	o.mu.Unlock()
	f.BotDirectUnits, f.BotDirectRequests = d.units.Load(), d.requests.Load()
	d.mu.Lock()
	for k, v := range d.codes {
		f.BotDirectCodes[k] = v
	}
	d.mu.Unlock()

	var solveCPU []float64
	var tries, solves float64
	var etaErr []float64
	var afterA, afterB, preA, preB []float64
	var botPolls int64
	var botWait float64
	for _, b := range append(slices.Clone(people), bots...) {
		if b.tries > 0 {
			tries += float64(b.tries)
			solves++
			solveCPU = append(solveCPU, float64(b.solveCPU)/1e6)
		}
		if b.bot {
			f.BotOutcomes[b.outcome]++
			if !b.admitted.IsZero() {
				f.BotsAdmitted++
			}
			if b.outcome == "bought" {
				f.BotRoomUnits++
			}
			if !b.joined.IsZero() {
				botPolls += b.polls
				botWait += b.end.Sub(b.joined).Seconds()
			}
			continue
		}
		f.PeopleOutcomes[b.outcome]++
		if b.outcome == "bought" {
			f.PeopleUnits++
			f.LastUnitS = max(f.LastUnitS, round(b.end.Sub(o.opensAt).Seconds(), 2))
		}
		if !b.joined.IsZero() {
			f.PeoplePolls += b.polls
			f.PeopleWaitingS += b.end.Sub(b.joined).Seconds()
		}
		if b.admitted.IsZero() {
			continue
		}
		f.PeopleAdmitted++
		if !b.predicted.IsZero() {
			etaErr = append(etaErr, math.Abs(b.admitted.Sub(b.predicted).Seconds()))
		}
		if b.joined.Before(o.opensAt) {
			preA, preB = append(preA, float64(b.arrival.UnixNano())), append(preB, float64(b.admitted.UnixNano()))
		} else {
			afterA, afterB = append(afterA, float64(b.arrival.UnixNano())), append(afterB, float64(b.admitted.UnixNano()))
		}
	}
	if f.Units > 0 {
		f.PeopleShare = round(float64(f.PeopleUnits)/float64(f.Units), 3)
	}
	f.Fairness, f.FairnessN = spearman(afterA, afterB), len(afterA)
	f.FairnessPreOpen, f.FairnessPreN = spearman(preA, preB), len(preA)
	f.PeopleWaitingS = round(f.PeopleWaitingS, 2)
	if f.PeopleWaitingS > 0 {
		f.PollsPerWaitingS = round(float64(f.PeoplePolls)/f.PeopleWaitingS, 3)
	}
	if botWait > 0 {
		f.BotPollsPerWaitingS = round(float64(botPolls)/botWait, 1)
	}
	f.ETAErrorN = len(etaErr)
	f.ETAErrorP50, f.ETAErrorP90 = round(quantile(etaErr, 0.5), 2), round(quantile(etaErr, 0.9), 2)
	if solves > 0 {
		f.SolveTriesMean = round(tries/solves, 1)
	}
	f.SolveCPUMsP50, f.SolveCPUMsP90 = round(quantile(solveCPU, 0.5), 2), round(quantile(solveCPU, 0.9), 2)

	f.RunS = round(cpu.Span.Seconds(), 2)
	switch {
	case cpu.Span <= 0:
		f.CPUBasis = "not measured (no /proc)"
	case cpu.ServerPID != 0:
		f.ServerCPUS = cpu.Seconds(cpu.Server)
		f.CPUBasis = fmt.Sprintf("the server's process (pid %d)", cpu.ServerPID)
	default:
		var solved time.Duration
		for _, b := range append(slices.Clone(people), bots...) {
			solved += b.solveCPU
		}
		f.ServerCPUS = max(cpu.Seconds(cpu.Self)-solved.Seconds(), 0)
		f.CPUBasis = "in-process: this process's CPU minus the proofs solved in it (each measured on its own thread); the buyers' HTTP client work is still in it"
	}
	f.ServerCPUS = round(f.ServerCPUS, 3)
	if n := f.PeopleAdmitted + f.BotsAdmitted; n > 0 {
		f.ServerCPUMsPerAdmitted = round(f.ServerCPUS*1000/float64(n), 2)
	}
	return f
}

// quantile returns the q-quantile of xs (nearest rank; 0 if empty).
func quantile(xs []float64, q float64) float64 {
	if len(xs) == 0 {
		return 0
	}
	s := slices.Clone(xs)
	slices.Sort(s)
	i := int(math.Ceil(q*float64(len(s)))) - 1
	return s[min(max(i, 0), len(s)-1)]
}

// spearman returns Spearman's rank correlation of a and b (ties get their
// mean rank), or nil with fewer than 3 pairs or a constant side.
func spearman(a, b []float64) *float64 {
	if len(a) < 3 || len(a) != len(b) {
		return nil
	}
	ra, rb := ranks(a), ranks(b)
	var ma, mb float64
	for i := range ra {
		ma, mb = ma+ra[i], mb+rb[i]
	}
	n := float64(len(ra))
	ma, mb = ma/n, mb/n
	var cov, va, vb float64
	for i := range ra {
		da, db := ra[i]-ma, rb[i]-mb
		cov, va, vb = cov+da*db, va+da*da, vb+db*db
	}
	if va == 0 || vb == 0 {
		return nil
	}
	r := round(cov/math.Sqrt(va*vb), 3)
	return &r
}

func ranks(xs []float64) []float64 {
	idx := make([]int, len(xs))
	for i := range idx {
		idx[i] = i
	}
	slices.SortFunc(idx, func(i, j int) int {
		switch {
		case xs[i] < xs[j]:
			return -1
		case xs[i] > xs[j]:
			return 1
		}
		return 0
	})
	r := make([]float64, len(xs))
	for i := 0; i < len(idx); {
		j := i
		for j+1 < len(idx) && xs[idx[j+1]] == xs[idx[i]] {
			j++
		}
		for k := i; k <= j; k++ {
			r[idx[k]] = float64(i+j)/2 + 1
		}
		i = j + 1
	}
	return r
}

// WriteText prints f under label.
func (f *OpeningFigures) WriteText(w io.Writer, label string) {
	num := func(x *float64) string {
		if x == nil {
			return "n/a"
		}
		return strconv.FormatFloat(*x, 'f', 3, 64)
	}
	fmt.Fprintf(w, "\n%s opening: %d people (%.0f%% never come back once admitted, arriving from %.3gs before to 1s after the opening), %d bot accounts (%d direct, %d through the room)\n",
		label, f.People, 100*f.NoReturnShare, f.EarlyS, f.Bots, f.Bots/2, f.Bots-f.Bots/2)
	fmt.Fprintf(w, "  units sold %d: people %d (share %.3f), bots %d through the room, %d directly (%d direct purchases: %s)\n",
		f.Units, f.PeopleUnits, f.PeopleShare, f.BotRoomUnits, f.BotDirectUnits, f.BotDirectRequests, codeList(f.BotDirectCodes))
	fmt.Fprintf(w, "  people: %d admitted, outcomes %s; room bots: %d admitted, outcomes %s; last unit bought %.1fs after the opening\n",
		f.PeopleAdmitted, intList(f.PeopleOutcomes), f.BotsAdmitted, intList(f.BotOutcomes), f.LastUnitS)
	fmt.Fprintf(w, "  fairness (Spearman, arrival vs admission): %s over %d people who joined after the opening; %s over %d pre-opening joiners (a lottery: ~0)\n",
		num(f.Fairness), f.FairnessN, num(f.FairnessPreOpen), f.FairnessPreN)
	fmt.Fprintf(w, "  polls per waiting buyer per second: %.3f (people: %d polls over %.1f waiting s); room bots ignoring poll_after: %.1f\n",
		f.PollsPerWaitingS, f.PeoplePolls, f.PeopleWaitingS, f.BotPollsPerWaitingS)
	fmt.Fprintf(w, "  ETA error |actual - predicted|: p50 %.2fs, p90 %.2fs over %d admitted people given an ETA\n", f.ETAErrorP50, f.ETAErrorP90, f.ETAErrorN)
	fmt.Fprintf(w, "  proof of work: %.1f derivations per solve, CPU per solve p50 %.1f ms, p90 %.1f ms (native Go: a bot's speed)\n", f.SolveTriesMean, f.SolveCPUMsP50, f.SolveCPUMsP90)
	fmt.Fprintf(w, "  server CPU: %.3fs over %.1fs, %.2f ms per admitted buyer (%s)\n", f.ServerCPUS, f.RunS, f.ServerCPUMsPerAdmitted, f.CPUBasis)
}

func intList(m map[string]int) string {
	c := make(map[string]int64, len(m))
	for k, v := range m {
		c[k] = int64(v)
	}
	return codeList(c)
}
