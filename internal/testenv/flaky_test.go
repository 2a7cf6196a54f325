package testenv_test

import (
	"testing"

	"github.com/flashsale/flashsale/internal/testenv"
)

// TestResetProxy: at rate 0 it forwards; at rate 1 the first segment resets
// the connection; back at 0 new connections pass again.
func TestResetProxy(t *testing.T) {
	addr, _ := echoServer(t)
	p := testenv.StartResetProxy(t, addr)

	c := dial(t, p.Addr())
	for _, msg := range []string{"one", "two", "three"} {
		roundTrip(t, c, msg)
	}
	if n := p.Resets(); n != 0 {
		t.Fatalf("%d resets at rate 0", n)
	}

	p.SetResetRate(1)
	c = dial(t, p.Addr())
	if _, err := c.Write([]byte("lost")); err != nil {
		t.Fatal(err)
	}
	expectBroken(t, c)
	if n := p.Resets(); n != 1 {
		t.Fatalf("%d resets after one segment at rate 1, want 1", n)
	}

	p.SetResetRate(0)
	roundTrip(t, dial(t, p.Addr()), "again")
}
