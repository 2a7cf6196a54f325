package main

import (
	"io"
	"strings"
	"testing"
)

// TestNATSReplicasSetting: FLASHSALE_NATS_REPLICAS defaults to 1 and a
// value JetStream cannot take fails at start with a clear message.
func TestNATSReplicasSetting(t *testing.T) {
	t.Parallel()
	parse := func(env map[string]string) (config, error) {
		return parseConfig("serve", nil, func(k string) string { return env[k] }, io.Discard, nil)
	}
	c, err := parse(nil)
	if err != nil || c.NATSReplicas != 1 {
		t.Fatalf("default: %d, %v; want 1", c.NATSReplicas, err)
	}
	c, err = parse(map[string]string{"FLASHSALE_NATS_REPLICAS": "3", "FLASHSALE_NATS_URL": "nats://a:4222,nats://b:4222"})
	if err != nil || c.NATSReplicas != 3 {
		t.Fatalf("3 on a cluster: %d, %v", c.NATSReplicas, err)
	}
	for _, tc := range []struct {
		env  map[string]string
		want string
	}{
		{map[string]string{"FLASHSALE_NATS_REPLICAS": "0"}, "nats-replicas must be 1..5"},
		{map[string]string{"FLASHSALE_NATS_REPLICAS": "-1"}, "nats-replicas must be 1..5"},
		{map[string]string{"FLASHSALE_NATS_REPLICAS": "7", "FLASHSALE_NATS_URL": "nats://a:4222"}, "nats-replicas must be 1..5"},
		{map[string]string{"FLASHSALE_NATS_REPLICAS": "3"}, "needs a JetStream cluster"},
	} {
		if _, err := parse(tc.env); err == nil || !strings.Contains(err.Error(), tc.want) {
			t.Errorf("%v: %v; want an error with %q", tc.env, err, tc.want)
		}
	}
}
