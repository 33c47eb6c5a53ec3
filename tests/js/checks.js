// KafkaJS against an icelog broker: node checks.js <bootstrap> <topic prefix>. Prints one JSON line with what the
// client saw; tests/js/test_kafkajs.py judges it. The topics are created by the test (3 partitions, 1 for txn).
const { Kafka, logLevel, CompressionTypes } = require('kafkajs');

async function main() {
  const [bootstrap, prefix] = process.argv.slice(2);
  const kafka = new Kafka({ clientId: 'icelog-tests', brokers: bootstrap.split(','), logLevel: logLevel.NOTHING });
  const out = {};
  const topic = `${prefix}-js`;
  // An idempotent acks=all producer (KafkaJS's idempotence needs acks=-1 and one request in flight), gzip.
  const producer = kafka.producer({ idempotent: true, maxInFlightRequests: 1 });
  await producer.connect();
  const messages = Array.from({ length: 40 }, (_, i) => ({ key: `k${i}`, value: `v${i}`, headers: { h: `${i}` } }));
  const acked = await producer.send({ topic, acks: -1, compression: CompressionTypes.GZIP, messages });
  out.acked_batches = acked.length;

  // A transaction committed, another aborted.
  const txnTopic = `${prefix}-js-txn`;
  const txnProducer = kafka.producer({ transactionalId: `${prefix}-js-txid`, idempotent: true, maxInFlightRequests: 1 });
  await txnProducer.connect();
  for (const outcome of ['commit', 'abort']) {
    const txn = await txnProducer.transaction();
    await txn.send({ topic: txnTopic, messages: [0, 1, 2].map((i) => ({ value: `${outcome}${i}`, partition: 0 })) });
    await (outcome === 'commit' ? txn.commit() : txn.abort());
  }
  await txnProducer.disconnect();
  await producer.disconnect();

  // A consumer group reads everything (KafkaJS reads read_committed by default), committing as it goes.
  out.group = await readInGroup(kafka, `${prefix}-js-g`, topic, 40);
  out.txn_read_committed = await readInGroup(kafka, `${prefix}-js-txn-g`, txnTopic, 3);
  process.stdout.write(JSON.stringify(out) + '\n');
}

async function readInGroup(kafka, groupId, topic, want) {
  const consumer = kafka.consumer({ groupId });
  await consumer.connect();
  await consumer.subscribe({ topic, fromBeginning: true });
  const values = [];
  await new Promise((resolve, reject) => {
    const timer = setTimeout(() => resolve(), 90000);
    consumer.run({
      eachMessage: async ({ message }) => {
        values.push(message.value.toString());
        if (values.length >= want) {
          clearTimeout(timer);
          resolve();
        }
      },
    }).catch(reject);
  });
  // One more second: a record delivered twice would show here.
  await new Promise((resolve) => setTimeout(resolve, 1000));
  await consumer.disconnect();
  return values.sort();
}

main().catch((err) => {
  process.stdout.write(JSON.stringify({ error: `${err.name}: ${err.message}` }) + '\n');
  process.exit(1);
});
