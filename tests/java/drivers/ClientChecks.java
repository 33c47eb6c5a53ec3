// Apache Kafka's Java client (kafka-clients 4.x) against an icelog broker: several checks in one JVM (a JVM start is
// slow on a busy machine). Usage: ClientChecks <bootstrap> <topic prefix> <check>...; each check prints one JSON line
// {"check": name, ...} with what the client saw, and tests/java/test_java_client.py judges it. A check that throws
// prints {"check": name, "error": "<exception class>: <message>"} and the next check runs.
import com.fasterxml.jackson.databind.ObjectMapper;
import java.nio.charset.StandardCharsets;
import java.time.Duration;
import java.util.ArrayList;
import java.util.Collections;
import java.util.HashMap;
import java.util.LinkedHashMap;
import java.util.List;
import java.util.Map;
import java.util.Optional;
import java.util.Properties;
import java.util.concurrent.ExecutionException;
import java.util.concurrent.Future;
import org.apache.kafka.clients.admin.Admin;
import org.apache.kafka.clients.admin.AdminClientConfig;
import org.apache.kafka.clients.admin.AlterConfigOp;
import org.apache.kafka.clients.admin.ConfigEntry;
import org.apache.kafka.clients.admin.DescribeClusterResult;
import org.apache.kafka.clients.admin.DescribeTopicsOptions;
import org.apache.kafka.clients.admin.LogDirDescription;
import org.apache.kafka.clients.admin.NewPartitions;
import org.apache.kafka.clients.admin.NewTopic;
import org.apache.kafka.clients.admin.OffsetSpec;
import org.apache.kafka.clients.admin.RecordsToDelete;
import org.apache.kafka.clients.admin.ReplicaInfo;
import org.apache.kafka.clients.admin.TopicDescription;
import org.apache.kafka.clients.consumer.ConsumerConfig;
import org.apache.kafka.clients.consumer.ConsumerRecord;
import org.apache.kafka.clients.consumer.KafkaConsumer;
import org.apache.kafka.clients.consumer.OffsetAndMetadata;
import org.apache.kafka.clients.consumer.OffsetAndTimestamp;
import org.apache.kafka.clients.producer.KafkaProducer;
import org.apache.kafka.clients.producer.ProducerConfig;
import org.apache.kafka.clients.producer.ProducerRecord;
import org.apache.kafka.clients.producer.RecordMetadata;
import org.apache.kafka.common.KafkaFuture;
import org.apache.kafka.common.Node;
import org.apache.kafka.common.TopicPartition;
import org.apache.kafka.common.TopicPartitionInfo;
import org.apache.kafka.common.config.ConfigResource;
import org.apache.kafka.common.header.Header;
import org.apache.kafka.common.serialization.StringDeserializer;
import org.apache.kafka.common.serialization.StringSerializer;

public final class ClientChecks {
  private static final ObjectMapper JSON = new ObjectMapper();
  private static final Duration WAIT = Duration.ofSeconds(60);
  // A compressible filler: a codec that does not make a batch smaller is still used by the Java producer, but keep
  // batches realistic.
  private static final String FILLER = "icelog-".repeat(20);

  private final String bootstrap;
  private final String prefix;

  private ClientChecks(String bootstrap, String prefix) {
    this.bootstrap = bootstrap;
    this.prefix = prefix;
  }

  public static void main(String[] args) throws Exception {
    ClientChecks checks = new ClientChecks(args[0], args[1]);
    for (int i = 2; i < args.length; i++) {
      String[] spec = args[i].split(":", 2);
      Map<String, Object> out = new LinkedHashMap<>();
      out.put("check", args[i]);
      try {
        switch (spec[0]) {
          case "produce" -> checks.produceAndRead(spec[1], out);
          case "transactions" -> checks.transactions(out);
          case "group" -> checks.group(out);
          case "times" -> checks.offsetsForTimes(out);
          case "epochs" -> checks.leaderEpochs(out);
          case "admin" -> checks.admin(out);
          default -> throw new IllegalArgumentException("no check " + spec[0]);
        }
      } catch (Exception e) {
        Throwable cause = e instanceof ExecutionException && e.getCause() != null ? e.getCause() : e;
        out.put("error", cause.getClass().getName() + ": " + cause.getMessage());
      }
      System.out.println(JSON.writeValueAsString(out));
      System.out.flush();
    }
  }

  private Properties common() {
    Properties props = new Properties();
    props.put("bootstrap.servers", bootstrap);
    return props;
  }

  private Admin admin() {
    Properties props = common();
    props.put(AdminClientConfig.DEFAULT_API_TIMEOUT_MS_CONFIG, "60000");
    return Admin.create(props);
  }

  private KafkaProducer<String, String> producer(Map<String, String> extra) {
    Properties props = common();
    props.put(ProducerConfig.ACKS_CONFIG, "all");
    props.put(ProducerConfig.ENABLE_IDEMPOTENCE_CONFIG, "true");
    props.put(ProducerConfig.LINGER_MS_CONFIG, "5");
    props.putAll(extra);
    return new KafkaProducer<>(props, new StringSerializer(), new StringSerializer());
  }

  private KafkaConsumer<String, String> consumer(Map<String, String> extra) {
    Properties props = common();
    props.put(ConsumerConfig.AUTO_OFFSET_RESET_CONFIG, "earliest");
    props.put(ConsumerConfig.ENABLE_AUTO_COMMIT_CONFIG, "false");
    props.putAll(extra);
    return new KafkaConsumer<>(props, new StringDeserializer(), new StringDeserializer());
  }

  private void createTopic(String topic, int partitions) throws Exception {
    try (Admin admin = admin()) {
      admin.createTopics(List.of(new NewTopic(topic, partitions, (short) 1))).all().get();
    }
  }

  private static List<TopicPartition> partitions(String topic, int count) {
    List<TopicPartition> tps = new ArrayList<>();
    for (int p = 0; p < count; p++) {
      tps.add(new TopicPartition(topic, p));
    }
    return tps;
  }

  /** Every record of the assigned partitions, from the start up to their end offsets. */
  private static List<List<Object>> readAll(KafkaConsumer<String, String> consumer, List<TopicPartition> tps) {
    consumer.assign(tps);
    consumer.seekToBeginning(tps);
    Map<TopicPartition, Long> end = consumer.endOffsets(tps);
    List<List<Object>> got = new ArrayList<>();
    long deadline = System.nanoTime() + WAIT.toNanos();
    while (System.nanoTime() < deadline && !reached(consumer, tps, end)) {
      for (ConsumerRecord<String, String> rec : consumer.poll(Duration.ofMillis(500))) {
        got.add(row(rec));
      }
    }
    return got;
  }

  private static boolean reached(KafkaConsumer<String, String> consumer, List<TopicPartition> tps,
                                 Map<TopicPartition, Long> end) {
    for (TopicPartition tp : tps) {
      if (consumer.position(tp) < end.get(tp)) {
        return false;
      }
    }
    return true;
  }

  private static List<Object> row(ConsumerRecord<String, String> rec) {
    Header header = rec.headers().lastHeader("h");
    String headerValue = header == null ? null : new String(header.value(), StandardCharsets.UTF_8);
    List<Object> out = new ArrayList<>();
    out.add(rec.partition());
    out.add(rec.offset());
    out.add(rec.key());
    out.add(rec.value() == null ? null : rec.value().replace(FILLER, ""));
    out.add(headerValue);
    out.add(rec.timestamp());
    return out;
  }

  /** An idempotent acks=all producer with one codec, then a consumer by assignment reads everything back. */
  private void produceAndRead(String codec, Map<String, Object> out) throws Exception {
    String topic = prefix + "-" + codec;
    createTopic(topic, 2);
    List<Future<RecordMetadata>> sent = new ArrayList<>();
    try (KafkaProducer<String, String> producer = producer(Map.of(ProducerConfig.COMPRESSION_TYPE_CONFIG, codec))) {
      for (int i = 0; i < 60; i++) {
        ProducerRecord<String, String> rec = new ProducerRecord<>(topic, i % 2, "k" + i, "v" + i + FILLER);
        rec.headers().add("h", Integer.toString(i).getBytes(StandardCharsets.UTF_8));
        sent.add(producer.send(rec));
      }
      producer.flush();
    }
    List<List<Object>> acked = new ArrayList<>();
    for (Future<RecordMetadata> future : sent) {
      RecordMetadata meta = future.get();
      acked.add(List.of(meta.partition(), meta.offset()));
    }
    out.put("acked", acked);
    try (KafkaConsumer<String, String> consumer = consumer(Map.of())) {
      out.put("received", readAll(consumer, partitions(topic, 2)));
    }
  }

  /** Committed, aborted, committed: read_committed sees the first and third, read_uncommitted all three. */
  private void transactions(Map<String, Object> out) throws Exception {
    String topic = prefix + "-txn";
    createTopic(topic, 1);
    try (KafkaProducer<String, String> producer =
             producer(Map.of(ProducerConfig.TRANSACTIONAL_ID_CONFIG, prefix + "-txid"))) {
      producer.initTransactions();
      String[] outcomes = {"commit", "abort", "commit"};
      for (int t = 0; t < outcomes.length; t++) {
        producer.beginTransaction();
        for (int i = 0; i < 5; i++) {
          producer.send(new ProducerRecord<>(topic, 0, outcomes[t] + t + "-" + i, "v"));
        }
        producer.flush();
        if (outcomes[t].equals("commit")) {
          producer.commitTransaction();
        } else {
          producer.abortTransaction();
        }
      }
    }
    for (String isolation : List.of("read_committed", "read_uncommitted")) {
      try (KafkaConsumer<String, String> consumer =
               consumer(Map.of(ConsumerConfig.ISOLATION_LEVEL_CONFIG, isolation))) {
        List<String> keys = new ArrayList<>();
        for (List<Object> row : readAll(consumer, partitions(topic, 1))) {
          keys.add((String) row.get(2));
        }
        out.put(isolation, keys);
        out.put(isolation + "_end", consumer.endOffsets(partitions(topic, 1)).values().iterator().next());
      }
    }
  }

  /** A classic consumer group: one member reads and commits, a second member resumes after the commit. */
  private void group(Map<String, Object> out) throws Exception {
    String topic = prefix + "-group";
    String group = prefix + "-g";
    createTopic(topic, 3);
    try (KafkaProducer<String, String> producer = producer(Map.of())) {
      for (int i = 0; i < 30; i++) {
        producer.send(new ProducerRecord<>(topic, "k" + i, "first"));
      }
      producer.flush();
    }
    Map<String, String> props = Map.of(ConsumerConfig.GROUP_ID_CONFIG, group);
    out.put("first", pollUntil(props, topic, 30));
    try (KafkaProducer<String, String> producer = producer(Map.of())) {
      for (int i = 0; i < 10; i++) {
        producer.send(new ProducerRecord<>(topic, "k" + i, "second"));
      }
      producer.flush();
    }
    out.put("second", pollUntil(props, topic, 10));
    try (Admin admin = admin()) {
      long committed = 0;
      for (OffsetAndMetadata offset : admin.listConsumerGroupOffsets(group).partitionsToOffsetAndMetadata().get()
                                           .values()) {
        committed += offset.offset();
      }
      out.put("committed_total", committed);
    }
  }

  /** Values a subscribed member received until it had `count` records (or the wait ran out), then commitSync. */
  private List<String> pollUntil(Map<String, String> props, String topic, int count) {
    List<String> values = new ArrayList<>();
    try (KafkaConsumer<String, String> consumer = consumer(props)) {
      consumer.subscribe(List.of(topic));
      long deadline = System.nanoTime() + WAIT.toNanos();
      while (values.size() < count && System.nanoTime() < deadline) {
        for (ConsumerRecord<String, String> rec : consumer.poll(Duration.ofMillis(500))) {
          values.add(rec.value());
        }
      }
      consumer.commitSync();
      // Anything past `count` would be a record delivered twice: poll once more to see it.
      for (ConsumerRecord<String, String> rec : consumer.poll(Duration.ofSeconds(1))) {
        values.add(rec.value());
      }
    }
    return values;
  }

  /** offsetsForTimes finds the first record at or after a timestamp; a seek there reads from it. */
  private void offsetsForTimes(Map<String, Object> out) throws Exception {
    String topic = prefix + "-times";
    createTopic(topic, 1);
    long base = System.currentTimeMillis() - 3_600_000L;
    try (KafkaProducer<String, String> producer = producer(Map.of())) {
      for (int i = 0; i < 10; i++) {
        producer.send(new ProducerRecord<>(topic, 0, base + i * 1000L, "k" + i, "v" + i));
      }
      producer.flush();
    }
    TopicPartition tp = new TopicPartition(topic, 0);
    try (KafkaConsumer<String, String> consumer = consumer(Map.of())) {
      consumer.assign(List.of(tp));
      Map<TopicPartition, OffsetAndTimestamp> found =
          consumer.offsetsForTimes(Map.of(tp, base + 2500L));
      OffsetAndTimestamp at = found.get(tp);
      out.put("offset", at == null ? null : at.offset());
      out.put("timestamp_delta", at == null ? null : at.timestamp() - base);
      Map<TopicPartition, OffsetAndTimestamp> after = consumer.offsetsForTimes(Map.of(tp, base + 60_000L));
      out.put("past_the_end", after.get(tp) == null ? null : after.get(tp).offset());
      consumer.seek(tp, at.offset());
      List<ConsumerRecord<String, String>> got = new ArrayList<>();
      long deadline = System.nanoTime() + WAIT.toNanos();
      while (got.isEmpty() && System.nanoTime() < deadline) {
        consumer.poll(Duration.ofMillis(500)).forEach(got::add);
      }
      out.put("first_key", got.isEmpty() ? null : got.get(0).key());
    }
  }

  /**
   * Leader epochs: offsetsForTimes' answer carries the partition's epoch (ListOffsets), and a seek to an offset with
   * that epoch makes the consumer validate its position (OffsetForLeaderEpoch, now that Metadata gives an epoch)
   * before it fetches; it then reads on from there, records produced after the seek too.
   */
  private void leaderEpochs(Map<String, Object> out) throws Exception {
    String topic = prefix + "-epochs";
    createTopic(topic, 1);
    TopicPartition tp = new TopicPartition(topic, 0);
    try (KafkaProducer<String, String> producer = producer(Map.of())) {
      for (int i = 0; i < 10; i++) {
        producer.send(new ProducerRecord<>(topic, 0, "k" + i, "v" + i));
      }
      producer.flush();
      try (KafkaConsumer<String, String> consumer = consumer(Map.of())) {
        consumer.assign(List.of(tp));
        OffsetAndTimestamp first = consumer.offsetsForTimes(Map.of(tp, 0L)).get(tp);
        out.put("times_leader_epoch", first.leaderEpoch().orElse(-1));
        consumer.seek(tp, new OffsetAndMetadata(4, Optional.of(0), ""));
        List<String> keys = new ArrayList<>();
        long deadline = System.nanoTime() + WAIT.toNanos();
        while (keys.size() < 6 && System.nanoTime() < deadline) {
          consumer.poll(Duration.ofMillis(500)).forEach(rec -> keys.add(rec.key()));
        }
        for (int i = 10; i < 15; i++) {
          producer.send(new ProducerRecord<>(topic, 0, "k" + i, "v" + i));
        }
        producer.flush();
        while (keys.size() < 11 && System.nanoTime() < deadline) {
          consumer.poll(Duration.ofMillis(500)).forEach(rec -> keys.add(rec.key()));
        }
        out.put("keys", keys);
        out.put("position", consumer.position(tp));
      }
    }
  }

  /** The AdminClient calls operators' tools make: each one's answer, or the exception the client raised. */
  private void admin(Map<String, Object> out) throws Exception {
    String topic = prefix + "-admin";
    try (Admin admin = admin()) {
      call(out, "createTopics", () -> {
        admin.createTopics(List.of(new NewTopic(topic, 2, (short) 1))).all().get();
        return "ok";
      });
      call(out, "describeCluster", () -> {
        DescribeClusterResult cluster = admin.describeCluster();
        Map<String, Object> r = new LinkedHashMap<>();
        r.put("clusterId", cluster.clusterId().get());
        Node controller = cluster.controller().get();
        r.put("controller", controller == null ? null : controller.id());
        List<String> nodes = new ArrayList<>();
        for (Node node : cluster.nodes().get()) {
          nodes.add(node.id() + "@" + node.host() + ":" + node.port());
        }
        r.put("nodes", nodes);
        return r;
      });
      call(out, "listTopics", () -> admin.listTopics().names().get().contains(topic));
      call(out, "describeTopics", () -> {
        TopicDescription d = admin.describeTopics(List.of(topic)).allTopicNames().get().get(topic);
        List<Object> parts = new ArrayList<>();
        for (TopicPartitionInfo p : d.partitions()) {
          parts.add(List.of(p.partition(), p.leader().id(), p.replicas().size(), p.isr().size()));
        }
        return Map.of("partitions", parts, "internal", d.isInternal());
      });
      call(out, "describeTopicsPaged", () -> {
        // One partition per DescribeTopicPartitions response: the client follows the broker's cursor.
        String other = topic + "-b";
        admin.createTopics(List.of(new NewTopic(other, 3, (short) 1))).all().get();
        Map<String, TopicDescription> both = admin.describeTopics(
            List.of(topic, other), new DescribeTopicsOptions().partitionSizeLimitPerResponse(1)).allTopicNames().get();
        Map<String, Object> r = new LinkedHashMap<>();
        for (Map.Entry<String, TopicDescription> e : both.entrySet()) {
          List<Integer> ids = new ArrayList<>();
          e.getValue().partitions().forEach(p -> ids.add(p.partition()));
          r.put(e.getKey().equals(topic) ? "a" : "b", ids);
        }
        admin.deleteTopics(List.of(other)).all().get();
        return r;
      });
      call(out, "incrementalAlterConfigs", () -> {
        ConfigResource resource = new ConfigResource(ConfigResource.Type.TOPIC, topic);
        admin.incrementalAlterConfigs(Map.of(resource, List.of(
            new AlterConfigOp(new ConfigEntry("retention.ms", "3600000"), AlterConfigOp.OpType.SET)))).all().get();
        return "ok";
      });
      call(out, "describeConfigs", () -> {
        ConfigResource resource = new ConfigResource(ConfigResource.Type.TOPIC, topic);
        return admin.describeConfigs(List.of(resource)).all().get().get(resource).get("retention.ms").value();
      });
      call(out, "createPartitions", () -> {
        admin.createPartitions(Map.of(topic, NewPartitions.increaseTo(3))).all().get();
        return admin.describeTopics(List.of(topic)).allTopicNames().get().get(topic).partitions().size();
      });
      long base = System.currentTimeMillis() - 60_000L;
      try (KafkaProducer<String, String> producer = producer(Map.of())) {
        for (int i = 0; i < 10; i++) {  // timestamps rising: the last record holds the max
          producer.send(new ProducerRecord<>(topic, 0, base + i, "k" + i, "v" + i));
        }
        producer.flush();
      }
      TopicPartition tp0 = new TopicPartition(topic, 0);
      call(out, "listOffsets", () -> {
        Map<String, Object> r = new LinkedHashMap<>();
        r.put("earliest", admin.listOffsets(Map.of(tp0, OffsetSpec.earliest())).partitionResult(tp0).get().offset());
        r.put("latest", admin.listOffsets(Map.of(tp0, OffsetSpec.latest())).partitionResult(tp0).get().offset());
        r.put("maxTimestamp",
              admin.listOffsets(Map.of(tp0, OffsetSpec.maxTimestamp())).partitionResult(tp0).get().offset());
        return r;
      });
      call(out, "deleteRecords", () -> admin.deleteRecords(Map.of(tp0, RecordsToDelete.beforeOffset(4)))
          .lowWatermarks().get(tp0).get().lowWatermark());
      call(out, "describeLogDirs", () -> {
        Map<String, LogDirDescription> dirs = admin.describeLogDirs(List.of(0)).allDescriptions().get().get(0);
        Map<String, Object> r = new LinkedHashMap<>();
        r.put("dirs", dirs.size());
        LogDirDescription dir = dirs.values().iterator().next();
        ReplicaInfo replica = dir.replicaInfos().get(tp0);
        r.put("size", replica == null ? null : replica.size());
        r.put("usable", dir.usableBytes().isPresent() && dir.usableBytes().getAsLong() > 0);
        return r;
      });
      call(out, "listTransactions", () -> admin.listTransactions().all().get().size());
      call(out, "describeProducers", () -> admin.describeProducers(List.of(tp0)).all().get().get(tp0)
          .activeProducers().size());
      call(out, "listGroups", () -> admin.listGroups().all().get().size() >= 0);
      call(out, "deleteTopics", () -> {
        admin.deleteTopics(List.of(topic)).all().get();
        return "ok";
      });
    }
  }

  private interface Call {
    Object run() throws Exception;
  }

  private static void call(Map<String, Object> out, String name, Call call) {
    Map<String, Object> result = new HashMap<>();
    try {
      result.put("ok", call.run());
    } catch (Exception e) {
      Throwable cause = e instanceof ExecutionException && e.getCause() != null ? e.getCause() : e;
      result.put("error", cause.getClass().getSimpleName());
      result.put("message", String.valueOf(cause.getMessage()));
    }
    out.put(name, result);
  }
}
