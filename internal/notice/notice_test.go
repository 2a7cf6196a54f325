package notice_test

import (
	"log/slog"
	"testing"
	"time"

	"github.com/google/go-cmp/cmp"
	"github.com/nats-io/nats.go"

	"github.com/flashsale/flashsale/internal/notice"
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
