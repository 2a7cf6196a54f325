// Package failpoint names the crash sites used by fault tests. A failpoint
// does nothing unless enabled by configuration (FLASHSALE_FAILPOINTS), which
// only tests set.
package failpoint

import (
	"fmt"
	"os"
	"strings"
	"sync"
)

// Names of the crash sites. Each is documented where it is placed.
const (
	// AfterGateBeforeRelay sits in the relay before a reservation accepted by
	// the gate is published to the stream.
	AfterGateBeforeRelay = "after_gate_before_relay"
	// ConsumerBeforeCommit sits in the consumer before the batch transaction.
	ConsumerBeforeCommit = "consumer_before_commit"
	// ConsumerAfterCommitBeforeAck sits in the consumer after the commit, before the acks.
	ConsumerAfterCommitBeforeAck = "consumer_after_commit_before_ack"
	// ReleaseAfterStatusBeforeRestock sits in the restorer: a release is
	// committed in the database, its units not yet back in Redis.
	ReleaseAfterStatusBeforeRestock = "release_after_status_before_restock"
	// RestoreAfterRedisBeforeDone sits in the restorer: owed changes (a
	// release, a direct sale, a stock change made outside flashsale) are
	// applied in Redis, not yet marked done in the database.
	RestoreAfterRedisBeforeDone = "restore_after_redis_before_done"
	// EventsAfterPublishBeforeMark sits in the event publisher: events are
	// in the stream, not yet marked published in the database.
	EventsAfterPublishBeforeMark = "events_after_publish_before_mark"
)

// Actions a failpoint can take.
const (
	// Exit ends the process at once with status 137, as SIGKILL would.
	Exit = "exit"
	// Hang blocks the calling goroutine forever.
	Hang = "hang"
)

var (
	mu      sync.RWMutex
	enabled map[string]string
	hits    = map[string]int{}
)

// Parse enables failpoints from a spec "name=action[,name=action]".
func Parse(spec string) error {
	m := map[string]string{}
	for _, part := range strings.Split(spec, ",") {
		part = strings.TrimSpace(part)
		if part == "" {
			continue
		}
		name, action, ok := strings.Cut(part, "=")
		if !ok || (action != Exit && action != Hang) {
			return fmt.Errorf("failpoint: bad spec %q (want name=exit|hang)", part)
		}
		m[name] = action
	}
	mu.Lock()
	enabled = m
	mu.Unlock()
	return nil
}

// Inject runs the action enabled for name, if any.
func Inject(name string) {
	mu.RLock()
	action, ok := enabled[name]
	mu.RUnlock()
	if !ok {
		return
	}
	mu.Lock()
	hits[name]++
	mu.Unlock()
	fmt.Fprintf(os.Stderr, "failpoint %s fired: %s\n", name, action)
	switch action {
	case Exit:
		os.Exit(137)
	case Hang:
		select {}
	}
}

// Hits returns how often name fired in this process.
func Hits(name string) int {
	mu.RLock()
	defer mu.RUnlock()
	return hits[name]
}
