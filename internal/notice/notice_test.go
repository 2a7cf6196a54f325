package notice_test

import (
	"fmt"
	"log/slog"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/google/uuid"
	"github.com/nats-io/nats.go"

	"github.com/flashsale/flashsale/internal/notice"
	"github.com/flashsale/flashsale/internal/sale"
	"github.com/flashsale/flashsale/internal/stockgate"
	"github.com/flashsale/flashsale/internal/testenv"
)

type noticed struct {
	SKU    string
	Reload bool
}

type noticer chan noticed

func (n noticer) Noticed(sku string, reload bool) { n <- noticed{sku, reload} }

// TestAnnounceReachesSubscribers: every reason reaches the subscriber, and
// only the ones that give units back (restore, compensate) skip the
// catalog reload; a malformed notice is dropped.
func TestAnnounceReachesSubscribers(t *testing.T) {
	url := testenv.NATS(t)
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	log := slog.New(slog.DiscardHandler)
	got := make(noticer, 16)
	sub, err := notice.Subscribe(nc, got, log)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()

	ann := notice.NewAnnouncer(nc, log)
	for _, raw := range []string{`not json`, `{"sku_id":"bad sku!","reason":"put"}`} {
		if err := nc.Publish(notice.Subject, []byte(raw)); err != nil {
			t.Fatal(err)
		}
	}
	ann.Announce("phone-1", "put")
	ann.Announce("phone-1", "warmup")
	ann.Announce("phone-2", "restore")
	ann.Announce("phone-2", "compensate")
	ann.Announce("", "put")
	if err := nc.Flush(); err != nil {
		t.Fatal(err)
	}

	want := []noticed{{"phone-1", true}, {"phone-1", true}, {"phone-2", false}, {"phone-2", false}, {"", true}}
	var seen []noticed
	timeout := time.After(5 * time.Second)
	for len(seen) < len(want) {
		select {
		case n := <-got:
			seen = append(seen, n)
		case <-timeout:
			t.Fatalf("noticed %v, want %v", seen, want)
		}
	}
	if diff := cmp.Diff(want, seen); diff != "" {
		t.Errorf("notices (-want +got):\n%s", diff)
	}
	select {
	case n := <-got:
		t.Errorf("noticed %v after the announced ones (a malformed notice?)", n)
	case <-time.After(100 * time.Millisecond):
	}
}

// TestSplitCompensationNoticed: a refused reservation of a split sale
// gives its units back in its own stock bucket ("<sku>~<n>"); the notice
// that announces it names the SKU, so every subscriber (of this release or
// the ones before, which accept SKU ids only) forgets its sold-out flag.
// A bucket name sent by an older publisher is taken as its SKU.
func TestSplitCompensationNoticed(t *testing.T) {
	ctx := t.Context()
	url := testenv.NATS(t)
	nc, err := nats.Connect(url)
	if err != nil {
		t.Fatal(err)
	}
	defer nc.Close()
	log := slog.New(slog.DiscardHandler)
	got := make(noticer, 16)
	sub, err := notice.Subscribe(nc, got, log)
	if err != nil {
		t.Fatal(err)
	}
	defer sub.Unsubscribe()

	rurl, prefix := testenv.Redis(t)
	g := stockgate.New(testenv.RedisClient(t, rurl), prefix)
	const sku, k = "split-n", 3
	if ok, err := g.SeedSplit(ctx, sku, stockgate.Config{PerUserLimit: 5}, k, 9, nil, nil, nil, nil, "e1"); err != nil || !ok {
		t.Fatalf("seed: %v %v", ok, err)
	}
	user := "u0"
	for i := 0; stockgate.HomeBucket(user, k) == 0; i++ {
		user = fmt.Sprintf("u%d", i)
	}
	r := sale.Reservation{OrderID: uuid.Must(uuid.NewV7()).String(), SKU: sku, User: user, Quantity: 1, AcceptedAt: time.Now().UnixMilli()}
	if _, err := g.ReserveIn(ctx, r, stockgate.Limits{}, k); err != nil {
		t.Fatal(err)
	}
	bucket := stockgate.HomeName(sku, user, k)
	ag := notice.AnnouncingGate{Gate: g, Announcer: notice.NewAnnouncer(nc, log)}
	if n, err := ag.Finalize(ctx, bucket, []stockgate.Outcome{{OrderID: r.OrderID, Refused: true}}); err != nil || n != 1 {
		t.Fatalf("finalize: %d %v", n, err)
	}
	// An older publisher's notice under the bucket's name.
	if err := nc.Publish(notice.Subject, []byte(`{"sku_id":"`+bucket+`","reason":"compensate"}`)); err != nil {
		t.Fatal(err)
	}
	want := []noticed{{sku, false}, {sku, false}}
	var seen []noticed
	timeout := time.After(5 * time.Second)
	for len(seen) < len(want) {
		select {
		case n := <-got:
			seen = append(seen, n)
		case <-timeout:
			t.Fatalf("noticed %v, want %v (bucket %s)", seen, want, bucket)
		}
	}
	if diff := cmp.Diff(want, seen); diff != "" {
		t.Errorf("notices (-want +got):\n%s", diff)
	}
}
