package bench

import (
	"context"
	"fmt"
	"strings"

	"github.com/flashsale/flashsale/internal/loadgen"
	"github.com/flashsale/flashsale/internal/strategy"
)

func (b *bench) openingConfig() loadgen.OpeningConfig {
	return loadgen.OpeningConfig{People: b.o.People, Bots: b.o.Bots, BotRate: b.o.BotRate, NoReturn: b.o.NoReturn, Early: b.o.Early,
		Stock: b.o.Stock, Patience: b.o.Duration, ServerPID: b.serverPID, RunID: randomHex(4)}
}

// measureOpening runs the opening scenario against cl, then closes the
// sale's room and tickets and checks I1-I7 from st as after every run.
func (b *bench) measureOpening(ctx context.Context, name string, cl *loadgen.Client, st *Stores) ([]*loadgen.StrategyResult, string, error) {
	chk := loadgen.Checker{DB: st.DB, DrainTimeout: b.o.DrainTimeout}
	if name == strategy.Pipeline {
		chk.Gate = st.Gate
	}
	op, err := loadgen.NewOpening(b.openingConfig())
	if err != nil {
		return nil, "", err
	}
	if err := op.Setup(ctx, cl); err != nil {
		return nil, "", fmt.Errorf("setting the sale up: %w", err)
	}
	if err := chk.CheckStores(ctx, st.Redis, []string{op.SKU()}); err != nil {
		return nil, "", err
	}
	b.status("%-16s opening: %d people, %d bots, %d units...", name, b.o.People, b.o.Bots, b.o.Stock)
	fig, err := op.Run(ctx, cl)
	if err != nil {
		return nil, "", err
	}
	b.status("%-16s draining and checking I1-I7...", name)
	v, err := chk.Check(ctx, op.Accepted())
	if err != nil {
		return nil, "", fmt.Errorf("checking: %w", err)
	}
	if err := op.CloseRoom(ctx, cl); err != nil {
		return nil, "", fmt.Errorf("closing the room for I7: %w", err)
	}
	if err := chk.CheckI7Sales(ctx, cl, op.Accepted(), "i7", b.o.I7Units, v); err != nil {
		return nil, "", fmt.Errorf("checking I7: %w", err)
	}
	res := &loadgen.StrategyResult{Strategy: name, Accepted: fig.Units, Sold: v.Sold, Oversold: v.Oversold, Lost: v.Lost,
		Doubled: v.Doubled, I7Units: v.I7Units, InvariantsOK: v.OK(), DrainSeconds: float64(v.DrainTime.Milliseconds()) / 1000,
		Violations: v.Violations, Opening: fig}
	verdict := "invariants hold"
	if !res.InvariantsOK {
		verdict = "VIOLATED: " + strings.Join(v.Violations, "; ")
	}
	b.status("%-16s people got %d of %d units, %s", name, fig.PeopleUnits, fig.Units, verdict)
	return []*loadgen.StrategyResult{res}, "", nil
}
