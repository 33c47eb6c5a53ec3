package main

import (
	"context"
	"fmt"
	"sort"
	"sync"

	"github.com/IBM/sarama"
)

// saramaChecks: an idempotent acks=all SyncProducer, then a consumer group member reading everything and committing.
func saramaChecks(ctx context.Context, bootstrap, prefix string, out map[string]any) error {
	topic := prefix + "-sarama"
	cfg := sarama.NewConfig()
	cfg.Version = sarama.V2_8_0_0
	cfg.Producer.RequiredAcks = sarama.WaitForAll
	cfg.Producer.Return.Successes = true
	cfg.Producer.Idempotent = true
	cfg.Producer.Compression = sarama.CompressionLZ4
	cfg.Net.MaxOpenRequests = 1
	producer, err := sarama.NewSyncProducer([]string{bootstrap}, cfg)
	if err != nil {
		return err
	}
	var offsets []int64
	for i := 0; i < 30; i++ {
		msg := &sarama.ProducerMessage{Topic: topic, Key: sarama.StringEncoder(fmt.Sprintf("k%d", i)),
			Value: sarama.StringEncoder(fmt.Sprintf("v%d", i))}
		_, offset, err := producer.SendMessage(msg)
		if err != nil {
			producer.Close()
			return fmt.Errorf("produce: %w", err)
		}
		offsets = append(offsets, offset)
	}
	producer.Close()
	out["produced"] = len(offsets)

	gcfg := sarama.NewConfig()
	gcfg.Version = sarama.V2_8_0_0
	gcfg.Consumer.Offsets.Initial = sarama.OffsetOldest
	gcfg.Consumer.Offsets.AutoCommit.Enable = false
	group, err := sarama.NewConsumerGroup([]string{bootstrap}, prefix+"-sarama-g", gcfg)
	if err != nil {
		return err
	}
	defer group.Close()
	handler := &collector{want: 30, done: make(chan struct{})}
	cctx, cancel := context.WithCancel(ctx)
	defer cancel()
	errs := make(chan error, 1)
	go func() {
		for cctx.Err() == nil {
			if err := group.Consume(cctx, []string{topic}, handler); err != nil {
				errs <- err
				return
			}
		}
	}()
	select {
	case <-handler.done:
	case err := <-errs:
		return fmt.Errorf("group: %w", err)
	case <-ctx.Done():
		return fmt.Errorf("group: timed out with %d records", len(handler.values))
	}
	cancel()
	sort.Strings(handler.values)
	out["group"] = handler.values
	return nil
}

type collector struct {
	mu     sync.Mutex
	want   int
	values []string
	done   chan struct{}
	once   sync.Once
}

func (c *collector) Setup(sarama.ConsumerGroupSession) error   { return nil }
func (c *collector) Cleanup(sarama.ConsumerGroupSession) error { return nil }

func (c *collector) ConsumeClaim(session sarama.ConsumerGroupSession, claim sarama.ConsumerGroupClaim) error {
	for msg := range claim.Messages() {
		c.mu.Lock()
		c.values = append(c.values, string(msg.Value))
		reached := len(c.values) >= c.want
		c.mu.Unlock()
		session.MarkMessage(msg, "")
		if reached {
			session.Commit()
			c.once.Do(func() { close(c.done) })
		}
	}
	return nil
}
