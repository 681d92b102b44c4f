// A sarama (Debian's golang-github-shopify-sarama-dev, 1.22) client for tests/test_sarama.py.
// Each step prints one JSON line; any error exits non-zero with the error on stderr.
//
//	saramacheck default <bootstrap> <topic>          sarama's default version (0.8.2): gzip
//	                                                 produce, consume; admin (at 0.11.0, as its
//	                                                 admin needs) create/list/describe
//	saramacheck group <bootstrap> <topic> <group>    version 0.10.2 (the lowest sarama groups
//	                                                 take): snappy produce, a consumer group that
//	                                                 marks every message and commits on close
package main

import (
	"context"
	"encoding/json"
	"fmt"
	"os"
	"time"

	"github.com/Shopify/sarama"
)

func fail(step string, err error) {
	fmt.Fprintf(os.Stderr, "%s: %v\n", step, err)
	os.Exit(1)
}

func emit(v map[string]interface{}) {
	b, _ := json.Marshal(v)
	fmt.Println(string(b))
}

func produce(addrs []string, cfg *sarama.Config, topic string, prefix string, n int) {
	cfg.Producer.Return.Successes = true
	cfg.Producer.RequiredAcks = sarama.WaitForAll
	cfg.Producer.Partitioner = sarama.NewManualPartitioner
	p, err := sarama.NewSyncProducer(addrs, cfg)
	if err != nil {
		fail("producer", err)
	}
	msgs := []*sarama.ProducerMessage{}
	for i := 0; i < n; i++ {
		msgs = append(msgs, &sarama.ProducerMessage{Topic: topic, Partition: 0,
			Key: sarama.StringEncoder(fmt.Sprintf("%s-k%d", prefix, i)), Value: sarama.StringEncoder(fmt.Sprintf("%s-value-%d-%s", prefix, i, "xxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxxx"))})
	}
	if err := p.SendMessages(msgs); err != nil {
		fail("produce", err)
	}
	offsets := []int64{}
	for _, m := range msgs {
		offsets = append(offsets, m.Offset)
	}
	emit(map[string]interface{}{"step": "produced", "offsets": offsets})
	if err := p.Close(); err != nil {
		fail("producer close", err)
	}
}

func main() {
	mode, addrs, topic := os.Args[1], []string{os.Args[2]}, os.Args[3]
	cfg := sarama.NewConfig()
	cfg.ClientID = "sarama-test"
	cfg.Metadata.Retry.Backoff = 100 * time.Millisecond
	switch mode {
	case "default":
		emit(map[string]interface{}{"step": "version", "version": cfg.Version.String()})
		// sarama's admin finds the controller with Metadata v1 (it refuses versions below
		// 0.10.0 itself); at 0.11.0 it creates with CreateTopics v1 and describes configs
		// with DescribeConfigs v0 (v1 from 1.1.0)
		adminCfg := sarama.NewConfig()
		adminCfg.Version = sarama.V0_11_0_0
		admin, err := sarama.NewClusterAdmin(addrs, adminCfg)
		if err != nil {
			fail("admin", err)
		}
		retention := "3600000"
		if err := admin.CreateTopic(topic, &sarama.TopicDetail{NumPartitions: 1, ReplicationFactor: 1,
			ConfigEntries: map[string]*string{"retention.ms": &retention}}, false); err != nil {
			fail("create topic", err)
		}
		cfg.Producer.Compression = sarama.CompressionGZIP
		produce(addrs, cfg, topic, "gz", 5)
		consumer, err := sarama.NewConsumer(addrs, cfg)
		if err != nil {
			fail("consumer", err)
		}
		pc, err := consumer.ConsumePartition(topic, 0, sarama.OffsetOldest)
		if err != nil {
			fail("consume partition", err)
		}
		got := []string{}
		offsets := []int64{}
		timeout := time.After(20 * time.Second)
		for len(got) < 5 {
			select {
			case m := <-pc.Messages():
				got = append(got, string(m.Key)+"="+string(m.Value))
				offsets = append(offsets, m.Offset)
			case err := <-pc.Errors():
				fail("consume", err)
			case <-timeout:
				fail("consume", fmt.Errorf("timed out with %d messages", len(got)))
			}
		}
		emit(map[string]interface{}{"step": "consumed", "messages": got, "offsets": offsets})
		pc.Close()
		consumer.Close()
		topics, err := admin.ListTopics()
		if err != nil {
			fail("list topics", err)
		}
		detail, ok := topics[topic]
		entries := map[string]string{}
		if ok {
			for k, v := range detail.ConfigEntries {
				if v != nil {
					entries[k] = *v
				}
			}
		}
		emit(map[string]interface{}{"step": "listed", "found": ok, "partitions": detail.NumPartitions, "configs": entries})
		configs, err := admin.DescribeConfig(sarama.ConfigResource{Type: sarama.TopicResource, Name: topic, ConfigNames: []string{"retention.ms", "cleanup.policy"}})
		if err != nil {
			fail("describe config", err)
		}
		described := map[string]interface{}{}
		for _, c := range configs {
			described[c.Name] = map[string]interface{}{"value": c.Value, "default": c.Default, "read_only": c.ReadOnly}
		}
		emit(map[string]interface{}{"step": "described", "configs": described})
		admin.Close()
	case "group":
		cfg.Version = sarama.V0_10_2_0
		cfg.Producer.Compression = sarama.CompressionSnappy
		produce(addrs, cfg, topic, "sn", 5)
		cfg.Consumer.Offsets.Initial = sarama.OffsetOldest
		cfg.Consumer.Offsets.CommitInterval = 200 * time.Millisecond
		group, err := sarama.NewConsumerGroup(addrs, os.Args[4], cfg)
		if err != nil {
			fail("consumer group", err)
		}
		go func() {
			for err := range group.Errors() {
				fmt.Fprintf(os.Stderr, "group error: %v\n", err)
			}
		}()
		h := &handler{want: 10, done: make(chan struct{})}
		ctx, cancel := context.WithTimeout(context.Background(), 30*time.Second)
		go func() {
			for ctx.Err() == nil {
				if err := group.Consume(ctx, []string{topic}, h); err != nil {
					fmt.Fprintf(os.Stderr, "consume: %v\n", err)
					return
				}
			}
		}()
		select {
		case <-h.done:
		case <-ctx.Done():
			fail("group", fmt.Errorf("timed out with %d messages", len(h.got)))
		}
		cancel()
		if err := group.Close(); err != nil {
			fail("group close", err)
		}
		emit(map[string]interface{}{"step": "group", "messages": h.got})
	}
}

type handler struct {
	want int
	got  []string
	done chan struct{}
}

func (h *handler) Setup(sarama.ConsumerGroupSession) error   { return nil }
func (h *handler) Cleanup(sarama.ConsumerGroupSession) error { return nil }
func (h *handler) ConsumeClaim(s sarama.ConsumerGroupSession, claim sarama.ConsumerGroupClaim) error {
	for m := range claim.Messages() {
		h.got = append(h.got, fmt.Sprintf("%d:%s", m.Offset, string(m.Key)))
		s.MarkMessage(m, "")
		if len(h.got) == h.want {
			close(h.done)
		}
	}
	return nil
}
