package main

import (
	"context"
	"fmt"
	"sort"
	"sync"
	"time"

	"github.com/twmb/franz-go/pkg/kgo"
)

// franz848Partitions is the topic's partition count: the test creates it so.
const franz848Partitions = 4

// franz848Member is one franz-go member of a KIP-848 group: its current assignment (kept by the assignment
// callbacks) and the records it has read.
type franz848Member struct {
	client   *kgo.Client
	mu       sync.Mutex
	assigned map[int32]bool
	values   []string
	read     map[int32]bool // partitions it read records from
}

func (m *franz848Member) assignment() []int32 {
	m.mu.Lock()
	defer m.mu.Unlock()
	var out []int32
	for p, held := range m.assigned {
		if held {
			out = append(out, p)
		}
	}
	sort.Slice(out, func(i, j int) bool { return out[i] < out[j] })
	return out
}

// franz848Checks: two franz-go members in one consumer group with franz-go's KIP-848 opt-in (ServerSideBalancer
// with a sticky balancer: the broker's "uniform" assignor) settle on disjoint shares of the partitions, then read
// every record produced after that between them and commit.
func franz848Checks(ctx context.Context, bootstrap, prefix string, out map[string]any) error {
	topic := prefix + "-franz848"
	group := topic + "-g"
	members := make([]*franz848Member, 2)
	for i := range members {
		m := &franz848Member{assigned: map[int32]bool{}, read: map[int32]bool{}}
		client, err := kgo.NewClient(kgo.SeedBrokers(bootstrap), kgo.ConsumerGroup(group), kgo.ConsumeTopics(topic),
			kgo.Balancers(kgo.CooperativeStickyBalancer()), kgo.ServerSideBalancer(),
			kgo.ConsumeResetOffset(kgo.NewOffset().AtStart()), kgo.DisableAutoCommit(),
			kgo.OnPartitionsAssigned(func(_ context.Context, _ *kgo.Client, got map[string][]int32) {
				m.mu.Lock()
				defer m.mu.Unlock()
				for _, p := range got[topic] {
					m.assigned[p] = true
				}
			}),
			kgo.OnPartitionsRevoked(func(_ context.Context, _ *kgo.Client, lost map[string][]int32) {
				m.mu.Lock()
				defer m.mu.Unlock()
				for _, p := range lost[topic] {
					m.assigned[p] = false
				}
			}),
			kgo.OnPartitionsLost(func(_ context.Context, _ *kgo.Client, lost map[string][]int32) {
				m.mu.Lock()
				defer m.mu.Unlock()
				for _, p := range lost[topic] {
					m.assigned[p] = false
				}
			}))
		if err != nil {
			return err
		}
		defer client.Close()
		m.client = client
		members[i] = m
	}

	// Both members poll from the start; the records come only once the group has settled.
	pollCtx, stopPolling := context.WithCancel(ctx)
	defer stopPolling()
	errs := make(chan error, len(members))
	var wg sync.WaitGroup
	for _, m := range members {
		wg.Add(1)
		go func(m *franz848Member) {
			defer wg.Done()
			for pollCtx.Err() == nil {
				fetches := m.client.PollFetches(pollCtx)
				for _, fetchErr := range fetches.Errors() {
					if pollCtx.Err() == nil {
						errs <- fmt.Errorf("poll: %w", fetchErr.Err)
						return
					}
				}
				m.mu.Lock()
				fetches.EachRecord(func(r *kgo.Record) {
					m.values = append(m.values, string(r.Value))
					m.read[r.Partition] = true
				})
				m.mu.Unlock()
			}
		}(m)
	}

	settled := func() bool {
		seen := map[int32]bool{}
		for _, m := range members {
			held := m.assignment()
			if len(held) == 0 {
				return false
			}
			for _, p := range held {
				if seen[p] {
					return false
				}
				seen[p] = true
			}
		}
		return len(seen) == franz848Partitions
	}
	for !settled() {
		select {
		case err := <-errs:
			return err
		case <-ctx.Done():
			return fmt.Errorf("the group never settled: %v and %v", members[0].assignment(), members[1].assignment())
		case <-time.After(100 * time.Millisecond):
		}
	}
	out["assignments"] = [][]int32{members[0].assignment(), members[1].assignment()}

	producer, err := kgo.NewClient(kgo.SeedBrokers(bootstrap), kgo.DefaultProduceTopic(topic),
		kgo.RecordPartitioner(kgo.ManualPartitioner()))
	if err != nil {
		return err
	}
	defer producer.Close()
	var records []*kgo.Record
	for i := 0; i < 60; i++ {
		records = append(records, &kgo.Record{Value: []byte(fmt.Sprintf("v%d", i)), Partition: int32(i % franz848Partitions)})
	}
	if err := producer.ProduceSync(ctx, records...).FirstErr(); err != nil {
		return fmt.Errorf("produce: %w", err)
	}

	total := func() int {
		n := 0
		for _, m := range members {
			m.mu.Lock()
			n += len(m.values)
			m.mu.Unlock()
		}
		return n
	}
	for total() < len(records) {
		select {
		case err := <-errs:
			return err
		case <-ctx.Done():
			return fmt.Errorf("read %d of %d records", total(), len(records))
		case <-time.After(100 * time.Millisecond):
		}
	}
	stopPolling()
	wg.Wait()
	var all []string
	var read [][]int32
	for _, m := range members {
		if err := m.client.CommitUncommittedOffsets(ctx); err != nil {
			return fmt.Errorf("commit: %w", err)
		}
		all = append(all, m.values...)
		var parts []int32
		for p := range m.read {
			parts = append(parts, p)
		}
		sort.Slice(parts, func(i, j int) bool { return parts[i] < parts[j] })
		read = append(read, parts)
	}
	sort.Strings(all)
	out["values"] = all
	out["read_partitions"] = read
	return nil
}
