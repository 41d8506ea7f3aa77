// Drives RocketMQ 5's official Node.js client (rocketmq-client-nodejs, from npm) against a
// node's RocketMQ listener: the same roles and the same JSON events as official_client.py, so
// test_official_client.py runs one scenario through either client.
//
// node official_client.mjs ROLE CONFIG_JSON; every event is one JSON line on stdout, the
// client's own log goes to stderr. The cluster's CA comes in GRPC_DEFAULT_SSL_ROOTS_FILE_PATH,
// which grpc-js reads for the roots of an SSL channel. Roles:
//
// - produce: send `count` delay messages due `delay_s` seconds on, `tags` in turn; recall the
//   ones at `recall`.
// - simple: a SimpleConsumer of `group` with filter `tag`: receive until `expect` distinct ids
//   (or `timeout_s`); the first message received is put back for `retry_s`
//   (changeInvisibleDuration) and acked when it comes again; then receive for `quiet_s` more.
// - push: a PushConsumer of `group`; its listener fails the first attempt of the messages
//   whose body is in `fail_bodies`; runs until `expect` successes (or `timeout_s`).

import client from 'rocketmq-client-nodejs';

const { ConsumeResult, Producer, PushConsumer, SimpleConsumer } = client;

function emit(event, fields = {}) {
  process.stdout.write(`${JSON.stringify({ event, at: Date.now() / 1000, ...fields })}\n`);
}

const logger = {
  info: (...args) => console.error('INFO', ...args),
  warn: (...args) => console.error('WARN', ...args),
  error: (...args) => console.error('ERROR', ...args),
  debug: () => {},
};

const sleep = ms => new Promise(resolve => setTimeout(resolve, ms));

function options(config) {
  return {
    endpoints: config.endpoint,
    namespace: '',
    sslEnabled: true,
    sessionCredentials: { accessKey: config.access_key, accessSecret: config.secret_key },
    requestTimeout: 5000,
    logger,
  };
}

function describe(message, extra = {}) {
  return {
    id: message.messageId,
    body: message.body.toString(),
    tag: message.tag,
    keys: [...(message.keys ?? [])].sort(),
    attempt: message.deliveryAttempt,
    flagged: message.properties.get('tickwheel.possible_duplicate') === 'true',
    ...extra,
  };
}

// The client tells every broker of its routes that it is done, and rejects if one cannot be
// reached (a shard's leader killed during the run): the run's events are complete by then.
async function shutdown(client) {
  try {
    await client.shutdown();
  } catch (error) {
    emit('shutdown_failed', { error: String(error).slice(0, 300) });
  }
}

async function produce(config) {
  const producer = new Producer({ ...options(config), topic: config.topic });
  await producer.startup();
  emit('started');
  const tags = config.tags ?? ['created'];
  const recall = new Set(config.recall ?? []);
  for (let index = 0; index < config.count; index++) {
    const body = `${config.prefix ?? 'm'}-${index}`;
    const tag = tags[index % tags.length];
    const due = new Date(Date.now() + config.delay_s * 1000);
    let receipt;
    try {
      receipt = await producer.send({
        topic: config.topic, tag, keys: [`order-${index}`], body: Buffer.from(body),
        deliveryTimestamp: due,
      });
    } catch (error) {
      emit('send_failed', { body, error: String(error).slice(0, 300) });
      continue;
    }
    emit('sent', { id: receipt.messageId, body, tag, due_s: due.getTime() / 1000,
      recall_handle: receipt.recallHandle });
    if (recall.has(index)) {
      const recalled = await producer.recallMessage(config.topic, receipt.recallHandle);
      emit('recalled', { id: recalled.messageId });
    }
    if (config.pause_s) await sleep(config.pause_s * 1000);
  }
  await shutdown(producer);
  emit('done');
}

async function receive(consumer, invisibleS) {
  try {
    return await consumer.receive(16, invisibleS * 1000);
  } catch (error) { // a leader change: the client asks again
    emit('receive_failed', { error: String(error).slice(0, 300) });
    await sleep(500);
    return [];
  }
}

async function simple(config) {
  const consumer = new SimpleConsumer({
    ...options(config),
    consumerGroup: config.group,
    subscriptions: new Map([[config.topic, config.tag ?? '*']]),
    awaitDuration: (config.poll_s ?? 5) * 1000,
  });
  await consumer.startup();
  emit('started');
  const seen = new Set();
  let putBack = null;
  const deadline = Date.now() + config.timeout_s * 1000;
  while ((seen.size < config.expect || putBack !== null) && Date.now() < deadline) {
    for (const message of await receive(consumer, config.invisible_s ?? 15)) {
      emit('received', describe(message));
      try {
        if (config.retry_s && putBack === null && !seen.has(message.messageId)) {
          await consumer.changeInvisibleDuration(message, config.retry_s * 1000);
          putBack = message.messageId;
          emit('put_back', { id: message.messageId });
        } else {
          if (message.messageId === putBack) putBack = null;
          await consumer.ack(message);
          emit('acked', { id: message.messageId });
        }
      } catch (error) { // a leader change: the lease runs out, it comes again
        emit('settle_failed', { id: message.messageId, error: String(error).slice(0, 300) });
      }
      seen.add(message.messageId);
    }
  }
  const quietUntil = Date.now() + (config.quiet_s ?? 0) * 1000;
  while (Date.now() < quietUntil) {
    for (const message of await receive(consumer, 15)) {
      emit('received', describe(message, { late: true }));
      await consumer.ack(message);
    }
  }
  await shutdown(consumer);
  emit('done', { distinct: seen.size });
}

async function push(config) {
  const succeeded = new Set();
  const failBodies = new Set(config.fail_bodies ?? []);
  let finished;
  const done = new Promise(resolve => { finished = resolve; });
  const consumer = new PushConsumer({
    ...options(config),
    consumerGroup: config.group,
    subscriptions: new Map([[config.topic, '*']]),
    messageListener: {
      async consume(message) {
        if (failBodies.has(message.body.toString()) && message.deliveryAttempt === 1) {
          emit('failed', describe(message));
          return ConsumeResult.FAILURE;
        }
        emit('consumed', describe(message));
        succeeded.add(message.messageId);
        if (succeeded.size >= config.expect) finished();
        return ConsumeResult.SUCCESS;
      },
    },
  });
  await consumer.startup();
  emit('started');
  await Promise.race([done, sleep(config.timeout_s * 1000)]);
  await sleep((config.quiet_s ?? 0) * 1000);
  await shutdown(consumer);
  emit('done', { distinct: succeeded.size });
}

const [role, raw] = process.argv.slice(2);
const roles = { produce, simple, push };
try {
  await roles[role](JSON.parse(raw));
  process.exit(0); // the client's timers would keep the process alive after shutdown
} catch (error) {
  console.error(error);
  process.exit(1);
}
