// Apache Kafka's Java consumer 4.x with group.protocol=consumer (KIP-848) against an icelog broker. Usage:
// ConsumerGroupChecks <bootstrap> <topic prefix> <check>...; each check prints one JSON line {"check": name, ...} with
// what the consumers saw, judged by tests/java/test_java_consumer_groups.py. Consumers of one check are polled in
// turn by this thread, so their rebalance listeners run one at a time: a partition handed to one member while
// another still holds it is recorded in "double_owned". The check "member" is a lone member that runs until it is
// killed, printing its assignment whenever it changes.
import com.fasterxml.jackson.databind.ObjectMapper;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Collection;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Properties;
import java.util.Set;
import java.util.TreeSet;
import java.util.concurrent.ExecutionException;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AdminClientConfig;
import org.apache.kafka.clients.admin.ConsumerGroupDescription;
import org.apache.kafka.clients.admin.NewTopic;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRebalanceListener;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.clients.consumer.SubscriptionPattern;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.common.GroupState;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.serialization.StringDeserializer;
import org.apache.kafka.common.serialization.StringSerializer;

public final class ConsumerGroupChecks {
  private static final ObjectMapper JSON = new ObjectMapper();
  private static final long WAIT_MS = 60_000;

  private final String bootstrap;
  private final String prefix;
  private final Admin admin;

  private ConsumerGroupChecks(String bootstrap, String prefix) {
    this.bootstrap = bootstrap;
    this.prefix = prefix;
    Properties props = new Properties();
    props.put(AdminClientConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
    this.admin = Admin.create(props);
  }

  public static void main(String[] args) throws Exception {
    ConsumerGroupChecks checks = new ConsumerGroupChecks(args[0], args[1]);
    try {
      for (int i = 2; i < args.length; i++) {
        Map<String, Object> out = new LinkedHashMap<>();
        out.put("check", args[i]);
        try {
          switch (args[i]) {
            case "share" -> checks.share(out);
            case "static" -> checks.staticMember(out);
            case "regex" -> checks.regex(out);
            case "commit" -> checks.commit(out);
            case "mixed" -> checks.mixed(out);
            case "mixed-reverse" -> checks.mixedReverse(out);
            case "member" -> checks.member();
            default -> throw new IllegalArgumentException("no check " + args[i]);
          }
        } catch (Exception e) {
          Throwable cause = e instanceof ExecutionException && e.getCause() != null ? e.getCause() : e;
          out.put("error", cause.getClass().getName() + ": " + cause.getMessage());
        }
        System.out.println(JSON.writeValueAsString(out));
        System.out.flush();
      }
    } finally {
      checks.admin.close();
    }
  }

  /** Consumers of one group, polled in turn; what each owns as its rebalance listener says. */
  private final class Fleet implements AutoCloseable {
    final String group;
    final Map<String, KafkaConsumer<String, String>> consumers = new LinkedHashMap<>();
    final Map<String, Set<String>> owned = new LinkedHashMap<>();
    final List<String> doubleOwned = new ArrayList<>();
    final Map<String, List<String>> values = new HashMap<>();

    Fleet(String group) {
      this.group = group;
    }

    KafkaConsumer<String, String> add(String name, Map<String, String> extra) {
      Properties props = new Properties();
      props.put(ConsumerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
      props.put(ConsumerConfig.GROUP_ID_CONFIG, group);
      props.put(ConsumerConfig.GROUP_PROTOCOL_CONFIG, "consumer");
      props.put(ConsumerConfig.CLIENT_ID_CONFIG, name);
      props.put(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, "earliest");
      props.put(ConsumerConfig.KEY_DESERIALIZER_CLASS_CONFIG, StringDeserializer.class.getName());
      props.put(ConsumerConfig.VALUE_DESERIALIZER_CLASS_CONFIG, StringDeserializer.class.getName());
      props.putAll(extra);
      KafkaConsumer<String, String> consumer = new KafkaConsumer<>(props);
      owned.put(name, new TreeSet<>());
      values.put(name, new ArrayList<>());
      consumers.put(name, consumer);
      return consumer;
    }

    ConsumerRebalanceListener listener(String name) {
      return new ConsumerRebalanceListener() {
        @Override
        public void onPartitionsAssigned(Collection<TopicPartition> partitions) {
          for (TopicPartition tp : partitions) {
            String key = tp.topic() + ":" + tp.partition();
            owned.forEach((other, set) -> {
              if (!other.equals(name) && set.contains(key)) {
                doubleOwned.add(name + " got " + key + " held by " + other);
              }
            });
            owned.get(name).add(key);
          }
        }

        @Override
        public void onPartitionsRevoked(Collection<TopicPartition> partitions) {
          partitions.forEach(tp -> owned.get(name).remove(tp.topic() + ":" + tp.partition()));
        }

        @Override
        public void onPartitionsLost(Collection<TopicPartition> partitions) {
          onPartitionsRevoked(partitions);
        }
      };
    }

    void poll() {
      consumers.forEach((name, consumer) -> {
        for (ConsumerRecord<String, String> rec : consumer.poll(Duration.ofMillis(20))) {
          values.get(name).add(rec.value());
        }
      });
    }

    void close(String name) {
      consumers.remove(name).close();  // a static member's close keeps its place (epoch -2); a dynamic one leaves
      owned.remove(name);
    }

    /** Poll until every partition is owned, balanced, and the AdminClient (ConsumerGroupDescribe) says Stable. */
    Map<String, List<String>> settle(Set<String> partitions) throws Exception {
      long deadline = System.currentTimeMillis() + WAIT_MS;
      while (true) {
        poll();
        Set<String> union = new TreeSet<>();
        int min = Integer.MAX_VALUE;
        int max = 0;
        for (Set<String> set : owned.values()) {
          union.addAll(set);
          min = Math.min(min, set.size());
          max = Math.max(max, set.size());
        }
        if (union.equals(partitions) && min > 0 && max - min <= 1) {
          ConsumerGroupDescription described =
              admin.describeConsumerGroups(List.of(group)).describedGroups().get(group).get();
          if (described.groupState() == GroupState.STABLE && described.members().size() == consumers.size()) {
            Map<String, List<String>> snapshot = new LinkedHashMap<>();
            owned.forEach((name, set) -> snapshot.put(name, new ArrayList<>(set)));
            return snapshot;
          }
        }
        if (System.currentTimeMillis() > deadline) {
          throw new IllegalStateException("no stable assignment of " + partitions + ": " + owned);
        }
      }
    }

    @Override
    public void close() {
      new ArrayList<>(consumers.keySet()).forEach(this::close);
    }
  }

  private void createTopic(String topic, int partitions) throws Exception {
    admin.createTopics(List.of(new NewTopic(topic, partitions, (short) 1))).all().get();
  }

  private static Set<String> every(String topic, int count) {
    Set<String> out = new TreeSet<>();
    for (int p = 0; p < count; p++) {
      out.add(topic + ":" + p);
    }
    return out;
  }

  private void produce(String topic, int count) throws Exception {
    Properties props = new Properties();
    props.put(ProducerConfig.BOOTSTRAP_SERVERS_CONFIG, bootstrap);
    props.put(ProducerConfig.KEY_SERIALIZER_CLASS_CONFIG, StringSerializer.class.getName());
    props.put(ProducerConfig.VALUE_SERIALIZER_CLASS_CONFIG, StringSerializer.class.getName());
    try (KafkaProducer<String, String> producer = new KafkaProducer<>(props)) {
      for (int i = 0; i < count; i++) {
        producer.send(new ProducerRecord<>(topic, i % 12, null, "v" + i)).get();
      }
    }
  }

  /** Two members, a third joins, the third leaves: each stage's assignment and every record read. */
  private void share(Map<String, Object> out) throws Exception {
    String topic = prefix + "-share";
    createTopic(topic, 12);
    produce(topic, 120);
    try (Fleet fleet = new Fleet(prefix + "-share")) {
      for (String name : List.of("a", "b")) {
        fleet.add(name, Map.of()).subscribe(List.of(topic), fleet.listener(name));
      }
      out.put("two", fleet.settle(every(topic, 12)));
      fleet.add("c", Map.of()).subscribe(List.of(topic), fleet.listener("c"));
      out.put("three", fleet.settle(every(topic, 12)));
      fleet.close("c");
      out.put("two_again", fleet.settle(every(topic, 12)));
      long deadline = System.currentTimeMillis() + WAIT_MS;
      Set<String> read = new TreeSet<>();
      while (read.size() < 120 && System.currentTimeMillis() < deadline) {
        fleet.poll();
        fleet.values.values().forEach(read::addAll);
      }
      out.put("records", read.size());
      out.put("double_owned", fleet.doubleOwned);
    }
  }

  /** Two static members; one closes (and will come back) and its instance returns under a new member id. */
  private void staticMember(Map<String, Object> out) throws Exception {
    String topic = prefix + "-static";
    createTopic(topic, 6);
    try (Fleet fleet = new Fleet(prefix + "-static")) {
      for (String name : List.of("a", "b")) {
        fleet.add(name, Map.of(ConsumerConfig.GROUP_INSTANCE_ID_CONFIG, "instance-" + name))
            .subscribe(List.of(topic), fleet.listener(name));
      }
      out.put("before", fleet.settle(every(topic, 6)));
      fleet.close("b");
      for (int i = 0; i < 20; i++) {
        fleet.poll();
      }
      out.put("while_away", new ArrayList<>(fleet.owned.get("a")));
      fleet.add("b-again", Map.of(ConsumerConfig.GROUP_INSTANCE_ID_CONFIG, "instance-b"))
          .subscribe(List.of(topic), fleet.listener("b-again"));
      out.put("after", fleet.settle(every(topic, 6)));
      out.put("double_owned", fleet.doubleOwned);
    }
  }

  /** A broker-side regex (SubscriptionPattern, RE2/J): a topic created later is assigned. */
  private void regex(Map<String, Object> out) throws Exception {
    String first = prefix + "-rx-first";
    String later = prefix + "-rx-later";
    createTopic(first, 2);
    try (Fleet fleet = new Fleet(prefix + "-regex")) {
      fleet.add("a", Map.of()).subscribe(new SubscriptionPattern(prefix + "-rx-.*"), fleet.listener("a"));
      out.put("first", fleet.settle(every(first, 2)).get("a"));
      createTopic(later, 3);
      Set<String> both = every(first, 2);
      both.addAll(every(later, 3));
      out.put("both", fleet.settle(both).get("a"));
    }
  }

  /** commitSync from a KIP-848 member (OffsetCommit v9, its member epoch), then another member resumes there. */
  private void commit(Map<String, Object> out) throws Exception {
    String topic = prefix + "-commit";
    createTopic(topic, 12);
    produce(topic, 24);
    String group = prefix + "-commit";
    try (Fleet fleet = new Fleet(group)) {
      KafkaConsumer<String, String> first =
          fleet.add("first", Map.of(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false"));
      first.subscribe(List.of(topic), fleet.listener("first"));
      fleet.settle(every(topic, 12));
      Map<TopicPartition, OffsetAndMetadata> offsets = new HashMap<>();
      for (int p = 0; p < 12; p++) {
        offsets.put(new TopicPartition(topic, p), new OffsetAndMetadata(1));
      }
      first.commitSync(offsets);
      fleet.close("first");
      KafkaConsumer<String, String> second = fleet.add("second", Map.of());
      second.subscribe(List.of(topic), fleet.listener("second"));
      fleet.settle(every(topic, 12));
      long deadline = System.currentTimeMillis() + WAIT_MS;
      while (fleet.values.get("second").size() < 12 && System.currentTimeMillis() < deadline) {
        fleet.poll();
      }
      for (int i = 0; i < 10; i++) {
        fleet.poll();  // anything more would be a record read twice
      }
      List<String> read = new ArrayList<>(fleet.values.get("second"));
      read.sort(null);
      out.put("resumed", read);
      out.put("committed", second.committed(Set.of(new TopicPartition(topic, 0))).get(new TopicPartition(topic, 0))
          .offset());
    }
  }

  /** A classic consumer (group.protocol=classic) subscribing to a group a KIP-848 member holds: what poll raises. */
  private void mixed(Map<String, Object> out) throws Exception {
    String topic = prefix + "-mixed";
    createTopic(topic, 2);
    try (Fleet fleet = new Fleet(prefix + "-mixed")) {
      fleet.add("kip848", Map.of()).subscribe(List.of(topic), fleet.listener("kip848"));
      fleet.settle(every(topic, 2));
      KafkaConsumer<String, String> classic =
          fleet.add("classic", Map.of(ConsumerConfig.GROUP_PROTOCOL_CONFIG, "classic"));
      classic.subscribe(List.of(topic));
      long deadline = System.currentTimeMillis() + WAIT_MS;
      try {
        while (System.currentTimeMillis() < deadline) {
          classic.poll(Duration.ofMillis(100));
          fleet.consumers.get("kip848").poll(Duration.ofMillis(10));
        }
        out.put("classic", "no error");
      } catch (Exception e) {
        out.put("classic", e.getClass().getSimpleName());
      }
      out.put("kip848_still_owns", new ArrayList<>(fleet.owned.get("kip848")));
    }
  }

  /** A KIP-848 consumer subscribing to a group a classic member holds: what poll raises. */
  private void mixedReverse(Map<String, Object> out) throws Exception {
    String topic = prefix + "-mixed-rev";
    createTopic(topic, 2);
    try (Fleet fleet = new Fleet(prefix + "-mixed-rev")) {
      KafkaConsumer<String, String> classic =
          fleet.add("classic", Map.of(ConsumerConfig.GROUP_PROTOCOL_CONFIG, "classic"));
      classic.subscribe(List.of(topic), fleet.listener("classic"));
      long deadline = System.currentTimeMillis() + WAIT_MS;
      while (fleet.owned.get("classic").size() < 2 && System.currentTimeMillis() < deadline) {
        classic.poll(Duration.ofMillis(100));
      }
      KafkaConsumer<String, String> kip848 = fleet.add("kip848", Map.of());
      kip848.subscribe(List.of(topic));
      try {
        while (System.currentTimeMillis() < deadline) {
          kip848.poll(Duration.ofMillis(100));
          classic.poll(Duration.ofMillis(10));
        }
        out.put("kip848", "no error");
      } catch (Exception e) {
        out.put("kip848", e.getClass().getSimpleName());
      }
      out.put("classic_still_owns", new ArrayList<>(fleet.owned.get("classic")));
    }
  }

  /** A lone member of the group <prefix>-kill on topic <prefix>-kill, until it is killed. */
  private void member() throws Exception {
    String topic = prefix + "-kill";
    try (Fleet fleet = new Fleet(prefix + "-kill")) {
      fleet.add("victim", Map.of()).subscribe(List.of(topic), fleet.listener("victim"));
      String last = "";
      while (true) {
        fleet.poll();
        String now = fleet.owned.get("victim").toString();
        if (!now.equals(last)) {
          System.out.println("assigned " + now);
          System.out.flush();
          last = now;
        }
      }
    }
  }
}
