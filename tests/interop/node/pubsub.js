'use strict'
/*
 * nsqjs playing one scenario of tests/interop/scenarios.py against an nsqd; run by
 * tests/interop/test_nsqjs.py:
 *
 *   node pubsub.js --port=PORT --topic=T --channel=C --scenario=pubsub|requeue|timeout|heartbeat
 *
 * It publishes with nsq.Writer and consumes with nsq.Reader (nsqdTCPAddresses), prints its
 * report as one line of JSON once it has every delivery it expects (or at its deadline), then
 * keeps its connections open until stdin ends, and closes them. Keep the plan below in step
 * with scenarios.py (publish_plan, first_attempt_action).
 */

const nsq = require('nsqjs')

const MAX_IN_FLIGHT = 200
const PUBS_PER_ROUND = 25
const MPUB_SIZE = 100
const MSG_TIMEOUT_MS = 1000
const HEARTBEAT_INTERVAL_S = 1
const HEARTBEATS_BEFORE_PUBLISH = 3
const COUNTS = {pubsub: 10000, requeue: 20, timeout: 3, heartbeat: 1}
const CLIENT_DEADLINE_MS = 45000

function parseArgs(argv) {
  const args = {}
  for (const arg of argv) {
    const match = /^--([a-z]+)=(.*)$/.exec(arg)
    if (!match) throw new Error(`unexpected argument ${arg}`)
    args[match[1]] = match[2]
  }
  for (const name of ['port', 'topic', 'channel', 'scenario']) {
    if (!args[name]) throw new Error(`--${name}= is required`)
  }
  if (!(args.scenario in COUNTS)) throw new Error(`unknown scenario ${args.scenario}`)
  return args
}

function messageBodies(count) {
  return Array.from({length: count}, (_, index) => `msg-${index}`)
}

function bodyIndex(body) {
  return Number(body.slice(body.lastIndexOf('-') + 1))
}

// [["pub", [body]] | ["mpub", [bodies...]]]: rounds of 25 PUBs then an MPUB of 100.
function publishPlan(bodies) {
  const commands = []
  let position = 0
  while (position < bodies.length) {
    for (const body of bodies.slice(position, position + PUBS_PER_ROUND)) {
      commands.push(['pub', [body]])
    }
    position += PUBS_PER_ROUND
    const batch = bodies.slice(position, position + MPUB_SIZE)
    if (batch.length) commands.push(['mpub', batch])
    position += batch.length
  }
  return commands
}

function handlerAction(scenario, body, attempts) {
  if (attempts !== 1) return 'finish'
  const index = bodyIndex(body)
  if (scenario === 'requeue' && index % 2 === 0) return 'requeue'
  if (scenario === 'timeout' && index === 0) return 'hold'
  return 'finish'
}

function expectedDeliveryCount(scenario) {
  return messageBodies(COUNTS[scenario])
    .map((body) => (handlerAction(scenario, body, 1) === 'finish' ? 1 : 2))
    .reduce((total, count) => total + count, 0)
}

// nsqjs answers heartbeats with NOP internally and emits no event for them: count the NOPs
// the reader's connection writes (it sends NOP for nothing else), and keep the connection
// to read its IDENTIFY reply.
const readerConnections = []
let nopsSent = 0
const write = nsq.NSQDConnection.prototype.write
nsq.NSQDConnection.prototype.write = function (data) {
  if (!(this instanceof nsq.WriterNSQDConnection)) {
    if (!readerConnections.includes(this)) readerConnections.push(this)
    if (Buffer.from(data).toString() === 'NOP\n') nopsSent += 1
  }
  return write.call(this, data)
}

function waitFor(predicate) {
  return new Promise((resolve) => {
    const check = () => (predicate() ? resolve() : setTimeout(check, 5))
    check()
  })
}

async function play(args, report, state) {
  const {topic, channel, scenario} = args
  const port = Number(args.port)
  const plan = publishPlan(messageBodies(COUNTS[scenario]))
  const expectedDeliveries = expectedDeliveryCount(scenario)

  const writer = new nsq.Writer('127.0.0.1', port)
  state.writer = writer
  writer.on('error', (error) => report.errors.push(`writer: ${error}`))
  const writerReady = new Promise((resolve) => writer.on('ready', resolve))
  writer.connect()
  await writerReady

  const publishAll = () =>
    Promise.all(
      plan.map(
        ([command, bodies]) =>
          new Promise((resolve) => {
            writer.publish(topic, command === 'pub' ? bodies[0] : bodies, (error) => {
              if (error) report.publish_errors.push(String(error))
              else report.published_ok += 1
              resolve()
            })
          })
      )
    )
  if (scenario !== 'heartbeat') await publishAll()

  const options = {
    nsqdTCPAddresses: [`127.0.0.1:${port}`],
    maxInFlight: MAX_IN_FLIGHT,
    requeueDelay: 0, // REQ <id> 0
    // nsqjs backs off after each REQ; its default (up to 128 s) would outlast the test.
    maxBackoffDuration: 1,
  }
  if (scenario === 'timeout') options.messageTimeout = MSG_TIMEOUT_MS
  if (scenario === 'heartbeat') options.heartbeatInterval = HEARTBEAT_INTERVAL_S
  const reader = new nsq.Reader(topic, channel, options)
  state.reader = reader

  let allDelivered
  const delivered = new Promise((resolve) => (allDelivered = resolve))
  reader.on('message', (message) => {
    const body = message.body.toString()
    report.deliveries.push([body, message.attempts])
    const action = handlerAction(scenario, body, message.attempts)
    if (action === 'finish') message.finish()
    else if (action === 'requeue') message.requeue(0)
    // 'hold': never answer; nsqd must time it out.
    if (report.deliveries.length >= expectedDeliveries) allDelivered()
  })
  reader.on('error', (error) => {
    if (!state.closing) report.errors.push(`reader: ${error}`)
  })
  reader.on('nsqd_closed', () => {
    if (!state.closing) report.disconnects += 1
  })
  reader.connect()

  if (scenario === 'heartbeat') {
    await waitFor(() => nopsSent >= HEARTBEATS_BEFORE_PUBLISH)
    report.heartbeats_before_publish = nopsSent
    await publishAll()
  }
  await delivered
}

function main() {
  const args = parseArgs(process.argv.slice(2))
  const report = {
    client: 'nsqjs',
    published_ok: 0,
    publish_errors: [],
    deliveries: [],
    identify: null,
    heartbeats: 0,
    heartbeats_before_publish: 0,
    errors: [],
    disconnects: 0,
  }
  const state = {closing: false, reader: null, writer: null, reported: false}

  const finish = () => {
    if (state.reported) return
    state.reported = true
    clearTimeout(deadline)
    report.heartbeats = nopsSent
    if (readerConnections.length) {
      report.identify = readerConnections[0].statemachine.identifyResponse
    }
    process.stdout.write(JSON.stringify(report) + '\n')
    // Stay connected until stdin ends, then close and leave.
    process.stdin.on('end', () => {
      state.closing = true
      if (state.reader) state.reader.close()
      if (state.writer) state.writer.close()
      process.exit(0)
    })
    process.stdin.resume()
  }
  const deadline = setTimeout(() => {
    report.errors.push(`nsqjs did not finish in ${CLIENT_DEADLINE_MS / 1000}s`)
    finish()
  }, CLIENT_DEADLINE_MS)

  play(args, report, state).then(finish, (error) => {
    report.errors.push(`nsqjs failed: ${error && error.stack}`)
    finish()
  })
}

main()
