// A kafka-go (Debian's golang-github-segmentio-kafka-go-dev, 0.2.1) client for
// tests/test_go_clients.py: writes gzip-compressed messages (Produce v2, message format v1),
// reads them in a consumer group that commits (Fetch v2, JoinGroup v1, OffsetCommit v2).
// One JSON line per step; any error exits non-zero with the error on stderr.
//
//	kafkagocheck <bootstrap> <topic> <group>
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"time"

	kafka "github.com/segmentio/kafka-go"
	"github.com/segmentio/kafka-go/gzip"
)

func fail(step string, err error) {
	fmt.Fprintf(os.Stderr, "%s: %v\n", step, err)
	os.Exit(1)
}

func emit(v map[string]interface{}) {
	b, _ := json.Marshal(v)
	fmt.Println(string(b))
}

func main() {
	brokers, topic, group := []string{os.Args[1]}, os.Args[2], os.Args[3]
	ctx, cancel := context.WithTimeout(context.Background(), 60*time.Second)
	defer cancel()
	w := kafka.NewWriter(kafka.WriterConfig{Brokers: brokers, Topic: topic, CompressionCodec: gzip.NewCompressionCodec(),
		BatchTimeout: 10 * time.Millisecond, RequiredAcks: -1})
	msgs := []kafka.Message{}
	for i := 0; i < 5; i++ {
		msgs = append(msgs, kafka.Message{Key: []byte(fmt.Sprintf("go-k%d", i)), Value: []byte(fmt.Sprintf("go-value-%d-%s", i, "yyyyyyyyyyyyyyyyyyyyyyyyyyyyyyyy"))})
	}
	if err := w.WriteMessages(ctx, msgs...); err != nil {
		fail("write", err)
	}
	w.Close()
	emit(map[string]interface{}{"step": "written", "count": len(msgs)})
	r := kafka.NewReader(kafka.ReaderConfig{Brokers: brokers, Topic: topic, GroupID: group, MinBytes: 1, MaxBytes: 1 << 20, MaxWait: 100 * time.Millisecond})
	got := []string{}
	times := []int64{}
	for len(got) < 5 {
		m, err := r.ReadMessage(ctx)
		if err != nil {
			fail("read", err)
		}
		got = append(got, fmt.Sprintf("%d:%s=%s", m.Offset, string(m.Key), string(m.Value)))
		times = append(times, m.Time.UnixNano()/1e6)
	}
	if err := r.Close(); err != nil {
		fail("reader close", err)
	}
	emit(map[string]interface{}{"step": "read", "messages": got, "times": times})
}
