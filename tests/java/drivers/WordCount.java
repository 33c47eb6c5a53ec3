// A Kafka Streams word count with exactly_once_v2 against icelog: lines from <input> are split into words,
// re-keyed by word (a repartition topic), counted in a state store (a changelog topic) and the counts written to
// <output>. Usage: WordCount <bootstrap> <application id> <input> <output> <state dir> [processing guarantee].
// Runs until killed. The guarantee (default exactly_once_v2) is at_least_once for bench/streams_bench.py's baseline.
import java.util.Arrays;
import java.util.Locale;
import java.util.Properties;
import java.util.concurrent.CountDownLatch;
import org.apache.kafka.common.serialization.Serdes;
import org.apache.kafka.streams.KafkaStreams;
import org.apache.kafka.streams.StreamsBuilder;
import org.apache.kafka.streams.StreamsConfig;
import org.apache.kafka.streams.kstream.Consumed;
import org.apache.kafka.streams.kstream.Grouped;
import org.apache.kafka.streams.kstream.Materialized;
import org.apache.kafka.streams.kstream.Produced;

public final class WordCount {
  public static void main(String[] args) throws Exception {
    Properties props = new Properties();
    props.put(StreamsConfig.BOOTSTRAP_SERVERS_CONFIG, args[0]);
    props.put(StreamsConfig.APPLICATION_ID_CONFIG, args[1]);
    props.put(StreamsConfig.STATE_DIR_CONFIG, args[4]);
    props.put(StreamsConfig.PROCESSING_GUARANTEE_CONFIG, args.length > 5 ? args[5] : StreamsConfig.EXACTLY_ONCE_V2);
    props.put(StreamsConfig.COMMIT_INTERVAL_MS_CONFIG, "200");
    props.put(StreamsConfig.REPLICATION_FACTOR_CONFIG, "1");
    props.put(StreamsConfig.STATESTORE_CACHE_MAX_BYTES_CONFIG, "0");  // every update reaches the output
    props.put("auto.offset.reset", "earliest");

    StreamsBuilder builder = new StreamsBuilder();
    builder.stream(args[2], Consumed.with(Serdes.String(), Serdes.String()))
        .flatMapValues(line -> Arrays.asList(line.toLowerCase(Locale.ROOT).split("\\s+")))
        .groupBy((key, word) -> word, Grouped.with("by-word", Serdes.String(), Serdes.String()))
        .count(Materialized.as("counts"))
        .toStream()
        .to(args[3], Produced.with(Serdes.String(), Serdes.Long()));

    KafkaStreams streams = new KafkaStreams(builder.build(), props);
    CountDownLatch stopped = new CountDownLatch(1);
    streams.setStateListener((now, before) -> {
      System.out.println("STATE " + now);
      System.out.flush();
      if (now == KafkaStreams.State.ERROR || now == KafkaStreams.State.NOT_RUNNING) {
        stopped.countDown();
      }
    });
    streams.setUncaughtExceptionHandler(e -> {
      e.printStackTrace();
      return org.apache.kafka.streams.errors.StreamsUncaughtExceptionHandler.StreamThreadExceptionResponse
          .SHUTDOWN_CLIENT;
    });
    Runtime.getRuntime().addShutdownHook(new Thread(streams::close));
    streams.start();
    stopped.await();
  }
}
