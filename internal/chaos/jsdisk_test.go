package chaos

import (
	"fmt"
	"net/http"
	"os"
	"strings"
	"time"

	"github.com/flashsale/flashsale/internal/testenv"
)

// jsDiskFull: the embedded JetStream's store is on a small filesystem (a
// 16 MiB tmpfs) that fills mid-sale and is freed 4 s later. Purchases are
// accepted into the Redis outbox meanwhile and /readyz stays 200 with check
// jetstream-publish degraded; the embedded server restarts itself once the
// disk has room, publishing resumes without a restart of flashsale, and
// nothing accepted is lost. Before, nats-server kept the store's write
// error on the stream for good: nothing reached the database again until
// the process was restarted.
func jsDiskFull(r *rig) {
	disk := testenv.SmallDisk(r.t, 16<<20)
	r.set("FLASHSALE_DATA_DIR", disk, "FLASHSALE_NATS_URL", "")
	s := r.start()
	c := r.client(s)
	r.putSKU(c, 800, 2)
	wait := r.load(c, Load{Buyers: 1600, Workers: 16, Rate: 150, TwoKeys: 7, DoubleClick: 5, Tries: 8, For: 20 * time.Second})
	time.Sleep(1500 * time.Millisecond)
	filler := testenv.Fill(r.t, disk, 64<<10)
	full := time.Now()
	ready := func() Reply { return c.Do(r.ctx, http.MethodGet, "/readyz", "") }
	degraded := func(rz Reply) bool {
		return rz.Status == http.StatusOK && strings.Contains(rz.Raw, `"jetstream-publish":"unavailable"`)
	}
	var seen time.Duration
	for deadline := time.Now().Add(10 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		rz := ready()
		if degraded(rz) {
			seen = time.Since(full)
			r.res.fired = true
			break
		}
		if rz.Status != http.StatusOK {
			r.res.fail("/readyz with the stream's disk full: %d %s (want 200 degraded: purchases go on into the outbox)", rz.Status, rz.Raw)
		}
	}
	for end := time.Now().Add(4*time.Second - time.Since(full)); time.Now().Before(end); time.Sleep(200 * time.Millisecond) {
		if rz := ready(); rz.Status != http.StatusOK {
			r.res.fail("/readyz with the stream's disk full: %d %s", rz.Status, rz.Raw)
			break
		}
	}
	if err := os.Remove(filler); err != nil {
		r.t.Fatal(err)
	}
	healed := time.Now()
	var resumed time.Duration
	for deadline := time.Now().Add(30 * time.Second); time.Now().Before(deadline); time.Sleep(50 * time.Millisecond) {
		if rz := ready(); rz.Status == http.StatusOK && !degraded(rz) {
			resumed = time.Since(healed)
			break
		}
	}
	if resumed == 0 {
		r.res.fail("publishing never resumed by itself within 30 s of the disk being freed")
	}
	r.res.note = fmt.Sprintf("degraded %v after the disk filled; publishing again %v after it was freed",
		seen.Round(100*time.Millisecond), resumed.Round(100*time.Millisecond))
	wait()
	r.finish(c, healed)
}
