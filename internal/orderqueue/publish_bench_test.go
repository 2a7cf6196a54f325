package orderqueue_test

import (
	"fmt"
	"testing"
	"time"

	"github.com/flashsale/flashsale/internal/orderqueue"
)

// BenchmarkPublish measures the order stream's cost per message: batches of
// 256 reservations (what the relay sends) published and acknowledged by an
// in-process JetStream with file storage, client and server on the same
// cores. The µs/msg metric is the figure docs/scaling.md and `flashsale
// plan -nats-us` use.
func BenchmarkPublish(b *testing.B) {
	q := openQueueB(b)
	data := []byte(`{"order_id":"0190d6c4-0000-7000-8000-000000000000","sku_id":"k","user_id":"u","quantity":1,"accepted_at":1}`)
	msgs := make([]orderqueue.Message, 256)
	n := 0
	start := time.Now()
	for b.Loop() {
		for i := range msgs {
			n++
			msgs[i] = orderqueue.Message{ID: fmt.Sprintf("o%d", n), SKU: "k", Data: data}
		}
		for _, err := range q.Publish(b.Context(), msgs) {
			if err != nil {
				b.Fatal(err)
			}
		}
	}
	b.ReportMetric(float64(time.Since(start).Microseconds())/float64(n), "µs/msg")
}
