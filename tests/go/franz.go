package main

import (
	"context"
	"errors"
	"fmt"
	"sort"

	"github.com/twmb/franz-go/pkg/kgo"
)

// franzChecks: an idempotent producer (franz-go's default), a consumer group reading everything and committing, a
// second group member generation resuming after the commit, and transactions read with read_committed.
func franzChecks(ctx context.Context, bootstrap, prefix string, out map[string]any) error {
	topic := prefix + "-franz"
	producer, err := kgo.NewClient(kgo.SeedBrokers(bootstrap), kgo.DefaultProduceTopic(topic),
		kgo.RequiredAcks(kgo.AllISRAcks()), kgo.ProducerBatchCompression(kgo.ZstdCompression()))
	if err != nil {
		return err
	}
	defer producer.Close()
	var records []*kgo.Record
	for i := 0; i < 60; i++ {
		records = append(records, &kgo.Record{Key: []byte(fmt.Sprintf("k%d", i)), Value: []byte(fmt.Sprintf("v%d", i))})
	}
	if err := producer.ProduceSync(ctx, records...).FirstErr(); err != nil {
		return fmt.Errorf("produce: %w", err)
	}
	out["produced"] = len(records)

	group := prefix + "-franz-g"
	first, err := franzGroupRead(ctx, bootstrap, topic, group, 60)
	if err != nil {
		return fmt.Errorf("group: %w", err)
	}
	out["group_first"] = first
	more := []*kgo.Record{{Value: []byte("late1")}, {Value: []byte("late2")}}
	if err := producer.ProduceSync(ctx, more...).FirstErr(); err != nil {
		return fmt.Errorf("produce more: %w", err)
	}
	second, err := franzGroupRead(ctx, bootstrap, topic, group, 2)
	if err != nil {
		return fmt.Errorf("group again: %w", err)
	}
	out["group_second"] = second

	committed, aborted, err := franzTransactions(ctx, bootstrap, prefix+"-franz-txn")
	if err != nil {
		return fmt.Errorf("transactions: %w", err)
	}
	out["txn_read_committed"] = committed
	out["txn_read_uncommitted"] = aborted
	return nil
}

// franzGroupRead joins `group`, polls until `want` records came (sorted values), commits and leaves.
func franzGroupRead(ctx context.Context, bootstrap, topic, group string, want int) ([]string, error) {
	client, err := kgo.NewClient(kgo.SeedBrokers(bootstrap), kgo.ConsumerGroup(group), kgo.ConsumeTopics(topic),
		kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.DisableAutoCommit())
	if err != nil {
		return nil, err
	}
	defer client.Close()
	var values []string
	for len(values) < want {
		fetches := client.PollFetches(ctx)
		if ctx.Err() != nil {
			return values, ctx.Err()
		}
		if errs := fetches.Errors(); len(errs) > 0 {
			return values, errs[0].Err
		}
		fetches.EachRecord(func(r *kgo.Record) { values = append(values, string(r.Value)) })
	}
	if err := client.CommitUncommittedOffsets(ctx); err != nil {
		return values, err
	}
	sort.Strings(values)
	return values, nil
}

// franzTransactions commits one transaction and aborts another, then reads the partition from the start with both
// isolation levels.
func franzTransactions(ctx context.Context, bootstrap, topic string) ([]string, []string, error) {
	txn, err := kgo.NewClient(kgo.SeedBrokers(bootstrap), kgo.DefaultProduceTopic(topic),
		kgo.TransactionalID(topic+"-id"), kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		return nil, nil, err
	}
	defer txn.Close()
	for _, outcome := range []kgo.TransactionEndTry{kgo.TryCommit, kgo.TryAbort} {
		if err := txn.BeginTransaction(); err != nil {
			return nil, nil, err
		}
		for i := 0; i < 3; i++ {
			name := "commit"
			if outcome == kgo.TryAbort {
				name = "abort"
			}
			rec := &kgo.Record{Value: []byte(fmt.Sprintf("%s%d", name, i)), Partition: 0}
			if err := txn.ProduceSync(ctx, rec).FirstErr(); err != nil {
				return nil, nil, err
			}
		}
		if err := txn.EndTransaction(ctx, outcome); err != nil {
			return nil, nil, err
		}
	}
	committed, err := franzReadAll(ctx, bootstrap, topic, kgo.ReadCommitted(), 3)
	if err != nil {
		return nil, nil, err
	}
	everything, err := franzReadAll(ctx, bootstrap, topic, kgo.ReadUncommitted(), 6)
	return committed, everything, err
}

func franzReadAll(ctx context.Context, bootstrap, topic string, level kgo.IsolationLevel, want int) ([]string, error) {
	client, err := kgo.NewClient(kgo.SeedBrokers(bootstrap), kgo.FetchIsolationLevel(level),
		kgo.ConsumePartitions(map[string]map[int32]kgo.Offset{topic: {0: kgo.NewOffset().AtStart()}}))
	if err != nil {
		return nil, err
	}
	defer client.Close()
	var values []string
	for len(values) < want {
		fetches := client.PollFetches(ctx)
		if ctx.Err() != nil {
			return values, errors.New("timed out reading " + topic)
		}
		fetches.EachRecord(func(r *kgo.Record) { values = append(values, string(r.Value)) })
	}
	return values, nil
}
