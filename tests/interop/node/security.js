'use strict'
/*
 * nsqjs over TLS (optionally with snappy or deflate) against an nsqd; run by
 * tests/security/test_tls_interop.py:
 *
 *   node security.js --port=PORT --topic=T --channel=C --ca=CA.pem --compression=none|snappy|deflate
 *
 * It connects a Writer and a Reader with `tls: true` and certificate verification against
 * the given CA, publishes 200 messages (one PUB, one MPUB of the rest; every 50th body is
 * 100 kB of random bytes), consumes them, then prints one line of JSON: what it published and
 * received, any errors, and the IDENTIFY reply every connection received
 * (`conn.statemachine.identifyResponse`). It then keeps its connections open until stdin
 * ends (so the test can read nsqd's /stats of them), and closes them.
 */

const crypto = require('crypto')
const fs = require('fs')
const nsq = require('nsqjs')

const COUNT = 200
const DEADLINE_MS = 30000

function parseArgs(argv) {
  const args = {}
  for (const arg of argv) {
    const match = /^--([a-z]+)=(.*)$/.exec(arg)
    if (!match) throw new Error(`unexpected argument ${arg}`)
    args[match[1]] = match[2]
  }
  for (const name of ['port', 'topic', 'channel', 'ca', 'compression']) {
    if (!args[name]) throw new Error(`--${name}= is required`)
  }
  return args
}

function messageBodies(topic) {
  const noise = crypto.randomBytes(100000)
  return Array.from({length: COUNT}, (_, index) =>
    Buffer.concat([
      Buffer.from(`${topic}-${index}-`),
      index % 50 === 7 ? noise : Buffer.from('payload '.repeat(index % 50)),
    ])
  )
}

// Every connection nsqjs opens, reader's and writer's, to read their IDENTIFY replies.
const connections = []
const write = nsq.NSQDConnection.prototype.write
nsq.NSQDConnection.prototype.write = function (data) {
  if (!connections.includes(this)) connections.push(this)
  return write.call(this, data)
}

function identifyReplies(kind) {
  return connections
    .filter((conn) => (conn instanceof nsq.WriterNSQDConnection) === (kind === 'writer'))
    .map((conn) => conn.statemachine.identifyResponse)
}

async function play(args, report, state) {
  const {topic, channel} = args
  const port = Number(args.port)
  const tls = {
    tls: true,
    tlsVerification: true,
    ca: fs.readFileSync(args.ca),
    snappy: args.compression === 'snappy',
    deflate: args.compression === 'deflate',
    deflateLevel: 6,
  }
  const bodies = messageBodies(topic)

  const writer = new nsq.Writer('127.0.0.1', port, tls)
  state.writer = writer
  writer.on('error', (error) => {
    if (!state.closing) report.errors.push(`writer: ${error}`)
  })
  const writerReady = new Promise((resolve) => writer.on('ready', resolve))
  writer.connect()
  await writerReady

  const publish = (payload) =>
    new Promise((resolve) => {
      writer.publish(topic, payload, (error) => {
        if (error) report.errors.push(`publish: ${error}`)
        else report.published_ok += 1
        resolve()
      })
    })
  await publish(bodies[0])
  await publish(bodies.slice(1))

  const expected = new Set(bodies.map((body) => body.toString('base64')))
  const reader = new nsq.Reader(topic, channel, {
    nsqdTCPAddresses: [`127.0.0.1:${port}`],
    maxInFlight: 50,
    ...tls,
  })
  state.reader = reader
  let allReceived
  const received = new Promise((resolve) => (allReceived = resolve))
  reader.on('message', (message) => {
    if (expected.delete(message.body.toString('base64'))) report.received += 1
    else report.errors.push(`unexpected body of ${message.body.length} bytes`)
    message.finish()
    if (report.received === COUNT) allReceived()
  })
  reader.on('error', (error) => {
    if (!state.closing) report.errors.push(`reader: ${error}`)
  })
  reader.connect()
  await received
}

function main() {
  const args = parseArgs(process.argv.slice(2))
  const report = {client: 'nsqjs', published_ok: 0, received: 0, errors: [], identify: {}}
  const state = {closing: false, reader: null, writer: null, reported: false}

  const finish = () => {
    if (state.reported) return
    state.reported = true
    clearTimeout(deadline)
    report.identify = {writer: identifyReplies('writer'), reader: identifyReplies('reader')}
    process.stdout.write(JSON.stringify(report) + '\n')
    process.stdin.on('end', () => {
      state.closing = true
      if (state.reader) state.reader.close()
      if (state.writer) state.writer.close()
      process.exit(0)
    })
    process.stdin.resume()
  }
  const deadline = setTimeout(() => {
    report.errors.push(`nsqjs did not finish in ${DEADLINE_MS / 1000}s`)
    finish()
  }, DEADLINE_MS)
  play(args, report, state).then(finish, (error) => {
    report.errors.push(`failed: ${error && error.stack ? error.stack : error}`)
    finish()
  })
}

main()
