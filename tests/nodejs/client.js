// Apache RocketMQ's official Node.js client (rocketmq-client-nodejs, gRPC over @grpc/grpc-js)
// against a node's proxy, run as its own process by tests/integration/test_grpc.py, test_grpc_acl.py
// and test_grpc_cluster.py. The same commands and JSON lines as tests/integration/rocketmq5_client.py (the official Python
// client), so the two clients are held to the same answers: one line on stdout per message sent,
// consumed or checked, {"error": ...} for a failure. The client's own log goes to stderr (warnings
// and errors only), which the test shows when a run fails. `--tls` trusts the certificates of
// GRPC_DEFAULT_SSL_ROOTS_FILE_PATH (grpc-js reads it as grpcio does).
//
//   produce --topic T --count N [--tag X] [--keys K] [--message-group G] [--delay-ms D] [--async]
//           [--recall N]
//   simple  --topic T --group G --want N [--invisible S] [--mode ack|none|change:S] [--seconds W]
//           [--filter EXPR [--sql]]
//   push    --topic T --group G --seconds W [--fail-first N] [--successes N] [--tries N]
//           (done at N successes, or N tries of the listener, within W)
//   transaction --topic T --count N --end commit|rollback|none [--check-answer commit|rollback]
//           [--seconds W] [--checks N] (stays up W answering checks, or until N messages were checked)
'use strict';

const {
  Producer, SimpleConsumer, PushConsumer, ConsumeResult, FilterExpression,
} = require('rocketmq-client-nodejs');
const { FilterType, TransactionResolution } = require('rocketmq-client-nodejs/proto/apache/rocketmq/v2/definition_pb');

const FLAGS = new Set([ 'async', 'sql', 'tls' ]);
const DEFAULTS = {
  ak: '', sk: '', group: '', count: '1', prefix: 'm', tag: '', keys: '', 'message-group': '',
  'delay-ms': '0', recall: '0', filter: '*', want: '1', invisible: '30', mode: 'ack', seconds: '20',
  'fail-first': '0', successes: '0', tries: '0', end: 'commit', 'check-answer': '', checks: '0',
};

function parse(argv) {
  const args = { command: argv[0], ...DEFAULTS };
  for (let i = 1; i < argv.length; i++) {
    let [ key, value ] = argv[i].replace(/^--/, '').split(/=(.*)/s);
    if (FLAGS.has(key)) value = true;
    else if (value === undefined) value = argv[++i];
    args[key] = value;
  }
  return args;
}

function line(fields) {
  process.stdout.write(JSON.stringify(fields) + '\n');
}

const logger = {
  info(...args) { if (process.env.MQ_CLIENT_LOG) console.error('INFO', ...args); },
  debug(...args) { if (process.env.MQ_CLIENT_LOG) console.error('DEBUG', ...args); },
  warn(...args) { console.error('WARN', ...args); },
  error(...args) { console.error('ERROR', ...args); },
};

function options(args) {
  const common = { endpoints: args.endpoint, namespace: '', logger, requestTimeout: 5000, sslEnabled: args.tls === true };
  if (args.ak) common.sessionCredentials = { accessKey: args.ak, accessSecret: args.sk };
  return common;
}

function received(message) {
  return {
    // (grpc-js's protobuf reads an unset optional string as "", the Python client as None)
    id: message.messageId, body: message.body.toString(), tag: message.tag || null,
    keys: [ ...message.keys ].sort(), properties: Object.fromEntries(message.properties),
    attempt: message.deliveryAttempt, group: message.messageGroup || null, topic: message.topic,
  };
}

// An error and its causes, as the client chains them (a startup's failure wraps the refusal's status).
function failure(err) {
  const chain = [];
  for (let at = err; at && chain.length < 4; at = at.cause) chain.push(`${at.name}: ${at.message}`);
  return chain.join(' <- ');
}
const sleep = ms => new Promise(resolve => setTimeout(resolve, ms));

function outgoing(args, i) {
  const message = {
    topic: args.topic, body: Buffer.from(`${args.prefix}${i}`),
    properties: new Map([[ 'index', String(i) ]]),
  };
  if (args.tag) message.tag = args.tag;
  if (args.keys) message.keys = [ args.keys ];
  if (args['message-group']) message.messageGroup = args['message-group'];
  if (+args['delay-ms']) message.deliveryTimestamp = new Date(Date.now() + +args['delay-ms']);
  return message;
}

async function produce(args) {
  const producer = new Producer({ ...options(args), topic: args.topic });
  await producer.startup();
  try {
    const count = +args.count;
    if (args.async) {
      const sends = [ ...Array(count).keys() ].map(i => producer.send(outgoing(args, i)));
      const settled = await Promise.allSettled(sends);
      settled.forEach((result, index) => line(result.status === 'fulfilled'
        ? { id: result.value.messageId, offset: result.value.offset, index }
        : { error: failure(result.reason), index }));
      return;
    }
    for (let i = 0; i < count; i++) {
      try {
        const receipt = await producer.send(outgoing(args, i));
        line({ id: receipt.messageId, offset: receipt.offset, index: i });
        if (i < +args.recall) {
          const recalled = await producer.recallMessage(args.topic, receipt.recallHandle);
          line({ recalled: recalled.messageId });
        }
      } catch (err) {
        line({ error: failure(err), index: i });
      }
    }
  } finally {
    await producer.shutdown();
  }
}

function filterOf(args) {
  return new FilterExpression(args.filter, args.sql ? FilterType.SQL : FilterType.TAG);
}

async function simple(args) {
  const consumer = new SimpleConsumer({
    ...options(args), consumerGroup: args.group, awaitDuration: 2000,
    subscriptions: new Map([[ args.topic, filterOf(args) ]]),
  });
  await consumer.startup();
  const want = +args.want;
  const deadline = Date.now() + args.seconds * 1000;
  let got = 0;
  try {
    while (got < want && Date.now() < deadline) {
      let messages;
      try {
        messages = await consumer.receive(Math.min(32, want - got), args.invisible * 1000);
      } catch (err) {
        line({ error: failure(err) });
        await sleep(500);
        continue;
      }
      for (const message of messages) {
        got += 1;
        const out = received(message);
        if (args.mode === 'ack') {
          await consumer.ack(message);
        } else if (args.mode.startsWith('change:')) {
          await consumer.changeInvisibleDuration(message, args.mode.split(':')[1] * 1000);
          out.changed = true;
        }
        line(out);
      }
    }
  } finally {
    await consumer.shutdown();
  }
}

async function push(args) {
  const tries = new Map();
  let successes = 0;
  let calls = 0;
  let done;
  const finished = new Promise(resolve => { done = resolve; });
  const consumer = new PushConsumer({
    ...options(args), consumerGroup: args.group,
    subscriptions: new Map([[ args.topic, filterOf(args) ]]),
    messageListener: {
      consume(message) {
        const attempt = (tries.get(message.messageId) ?? 0) + 1;
        tries.set(message.messageId, attempt);
        const fail = attempt <= +args['fail-first'];
        line({ ...received(message), result: fail ? 'FAILURE' : 'SUCCESS' });
        successes += !fail;
        calls += 1;
        if ((+args.successes && successes >= +args.successes) || (+args.tries && calls >= +args.tries)) done();
        return fail ? ConsumeResult.FAILURE : ConsumeResult.SUCCESS;
      },
    },
  });
  await consumer.startup();
  try {
    await Promise.race([ finished, sleep(args.seconds * 1000) ]);
  } finally {
    await consumer.shutdown();
  }
}

const RESOLUTIONS = {
  commit: TransactionResolution.COMMIT, rollback: TransactionResolution.ROLLBACK,
};

async function transaction(args) {
  const checked = new Set();
  let allChecked;
  const finished = new Promise(resolve => { allChecked = resolve; });
  const checker = {
    async check(message) {
      line({ checked: message.messageId, body: message.body.toString(), topic: message.topic, answer: args['check-answer'] });
      checked.add(message.messageId);
      // (done a second after the last answer: the client ends the half once check() returns)
      if (+args.checks && checked.size >= +args.checks) setTimeout(allChecked, 1000);
      return RESOLUTIONS[args['check-answer']] ?? TransactionResolution.TRANSACTION_RESOLUTION_UNSPECIFIED;
    },
  };
  const producer = new Producer({ ...options(args), topic: args.topic, checker });
  await producer.startup();
  try {
    for (let i = 0; i < +args.count; i++) {
      try {
        const tx = producer.beginTransaction();
        const receipt = await producer.send({ topic: args.topic, body: Buffer.from(`${args.prefix}${i}`) }, tx);
        if (args.end === 'commit') await tx.commit();
        else if (args.end === 'rollback') await tx.rollback();
        line({ id: receipt.messageId, transaction: receipt.transactionId, index: i, end: args.end });
      } catch (err) {
        line({ error: failure(err), index: i });
      }
    }
    if (args['check-answer']) await Promise.race([ finished, sleep(args.seconds * 1000) ]);
  } finally {
    await producer.shutdown();
  }
}

const COMMANDS = { produce, simple, push, transaction };

async function main() {
  const args = parse(process.argv.slice(2));
  const command = COMMANDS[args.command];
  if (!command || !args.endpoint || !args.topic) {
    console.error(`usage: client.js ${Object.keys(COMMANDS).join('|')} --endpoint HOST:PORT --topic T ...`);
    process.exit(2);
  }
  await command(args);
}

// A client that cannot start (refused credentials, say) is an answer the test reads, as a line.
main().then(() => process.exit(0), err => {
  console.error(err);
  line({ error: failure(err) });
  process.exit(0);
});
