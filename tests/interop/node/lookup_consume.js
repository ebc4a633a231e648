'use strict'
/*
 * nsqjs consuming through nsqlookupd; run by tests/nsqlookupd/test_discovery_clients.py:
 *
 *   node lookup_consume.js --lookupd=127.0.0.1:PORT --topic=T --channel=C
 *
 * An nsq.Reader with only `lookupdHTTPAddresses` (polled every second) finds the nsqds that
 * host the topic. It prints one line of JSON per event as it happens:
 *   {"connected": "host:port"}   a connection to a discovered nsqd is up
 *   {"body": "..."}              a message, which it then FINishes
 *   {"error": "..."}             a reader error
 * and keeps consuming until stdin ends; then it closes the reader and exits 0.
 */

const nsq = require('nsqjs')

function parseArgs(argv) {
  const args = {}
  for (const arg of argv) {
    const match = /^--([a-z]+)=(.*)$/.exec(arg)
    if (!match) throw new Error(`unexpected argument ${arg}`)
    args[match[1]] = match[2]
  }
  for (const name of ['lookupd', 'topic', 'channel']) {
    if (!args[name]) throw new Error(`--${name}= is required`)
  }
  return args
}

function report(event) {
  process.stdout.write(JSON.stringify(event) + '\n')
}

function main() {
  const args = parseArgs(process.argv.slice(2))
  const reader = new nsq.Reader(args.topic, args.channel, {
    lookupdHTTPAddresses: [args.lookupd],
    lookupdPollInterval: 1, // seconds; the smallest nsqjs allows
    maxInFlight: 100,
  })
  let closing = false
  reader.on('nsqd_connected', (host, port) => report({connected: `${host}:${port}`}))
  reader.on('message', (message) => {
    report({body: message.body.toString()})
    message.finish()
  })
  reader.on('error', (error) => {
    if (!closing) report({error: String(error)})
  })
  reader.connect()

  process.stdin.on('end', () => {
    closing = true
    reader.close()
    process.exit(0)
  })
  process.stdin.resume()
}

main()
