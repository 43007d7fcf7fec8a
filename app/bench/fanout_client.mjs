// SSE subscribers for `rill bench fanout --client node`: N raw HTTP/1.1 connections, no dependencies.
//
// Usage: node fanout_client.mjs STREAM_URL N [DRAIN_SECONDS]
// stdout: `ready` once every subscriber has had its first control event; then, after the parent
// writes `stop <sent>` on stdin and every subscriber has seen seqs 0..sent-1 (or the drain timeout
// passed), one JSON line with the counts, latency percentiles (ms) and this process's CPU seconds.
import net from "node:net"
import { StringDecoder } from "node:string_decoder"

const [url, countArg, drainArg] = process.argv.slice(2)
const COUNT = Number(countArg)
const DRAIN_MS = Number(drainArg ?? 5) * 1000
const target = new URL(url)
if (target.protocol !== "http:" || !Number.isInteger(COUNT) || COUNT < 0) {
  process.stderr.write("usage: node fanout_client.mjs http://HOST:PORT/STREAM N [DRAIN_SECONDS]\n")
  process.exit(2)
}
const HOST = target.hostname.replace(/^\[|\]$/g, "")
const PORT = Number(target.port || 80)
const PATH = target.pathname
const HOST_HEADER = target.host

// One read buffer shared by every socket: a read is handled synchronously, so no per-read allocation.
const READ_BUFFER = Buffer.allocUnsafe(256 * 1024)
const HEAD = 0, SIZE = 1, DATA = 2, DATA_END = 3, RAW = 4
const now = () => performance.timeOrigin + performance.now()

let latencies = new Float64Array(1 << 16)
let latencyCount = 0
let readyCount = 0
let cpuAtReady = null
let sent = -1 // set by `stop <sent>`
const loggedStatuses = new Set()

function recordLatency(ms) {
  if (latencyCount === latencies.length) {
    const grown = new Float64Array(latencies.length * 2)
    grown.set(latencies)
    latencies = grown
  }
  latencies[latencyCount++] = ms
}

class Subscriber {
  constructor() {
    this.offset = "now"
    this.seen = new Uint8Array(256) // seq -> seen at least once
    this.distinct = 0
    this.duplicates = 0
    this.reconnects = 0
    this.ready = false
    this.closed = false // the server said streamClosed: nothing more will come
    this.conn = null
  }

  see(seq, latencyMs) {
    if (!Number.isInteger(seq) || seq < 0 || seq > 1e8) return // not one of the writer's messages
    if (seq >= this.seen.length) {
      const grown = new Uint8Array(Math.max(seq + 1, this.seen.length * 2))
      grown.set(this.seen)
      this.seen = grown
    }
    if (this.seen[seq]) this.duplicates++
    else {
      this.seen[seq] = 1
      this.distinct++
    }
    recordLatency(latencyMs)
  }

  connect() {
    this.conn = new Connection(this)
  }
}

// One response on one socket: de-chunks the body, then splits it into SSE events.
class Connection {
  constructor(sub) {
    this.sub = sub
    this.state = HEAD
    this.head = ""
    this.line = "" // a chunk-size line cut by a read
    this.left = 0 // bytes left in the current chunk (or the body, without chunking)
    this.decoder = new StringDecoder("utf8") // a character may be cut between reads or chunks
    this.cut = false // whether the decoder may be holding the start of a character
    this.text = "" // body text not yet split into lines
    this.event = ""
    this.data = null // the event's data lines joined with "\n"; null until one arrives
    this.failed = false
    this.over = false
    const query = `offset=${encodeURIComponent(sub.offset)}&live=sse`
    this.socket = net.connect({
      host: HOST,
      port: PORT,
      noDelay: true,
      onread: { buffer: READ_BUFFER, callback: (n, buf) => this.onRead(buf, n) },
    })
    this.socket.on("connect", () => {
      this.socket.write(`GET ${PATH}?${query} HTTP/1.1\r\nHost: ${HOST_HEADER}\r\nAccept: text/event-stream\r\n\r\n`)
    })
    this.socket.on("error", () => {
      this.failed = true
    })
    this.socket.on("close", () => this.onClose())
  }

  end(failed) {
    this.failed ||= failed
    this.over = true
    this.socket.destroy()
  }

  onClose() {
    const sub = this.sub
    if (sub.conn !== this) return
    sub.conn = null
    if (finished || sub.closed) return
    sub.reconnects++ // the server ends SSE responses now and then: resume from the last offset
    if (this.failed) setTimeout(() => finished || sub.connect(), 100)
    else sub.connect()
  }

  // buf is the shared READ_BUFFER: only bytes before `end` are this read's.
  onRead(buf, end) {
    if (this.over) return
    const at = now()
    let i = 0
    while (i < end && !this.over) {
      if (this.state === HEAD) {
        const before = this.head.length
        this.head += buf.toString("latin1", i, end)
        const stop = this.head.indexOf("\r\n\r\n")
        if (stop < 0) return
        i += stop + 4 - before
        this.startBody(this.head.slice(0, stop))
      } else if (this.state === SIZE) {
        const nl = buf.indexOf(10, i)
        if (nl < 0 || nl >= end) {
          this.line += buf.toString("latin1", i, end)
          i = end
          continue
        }
        const size = parseInt(this.line + buf.toString("latin1", i, nl), 16) // ignores ";ext" and "\r"
        this.line = ""
        i = nl + 1
        if (size === 0 || Number.isNaN(size)) this.end(Number.isNaN(size)) // last chunk: the response is over
        else {
          this.left = size
          this.state = DATA
        }
      } else if (this.state === DATA || this.state === RAW) {
        const stop = Math.min(end, i + this.left)
        const last = buf[stop - 1]
        if (this.cut || last >= 0x80) {
          this.text += this.decoder.write(buf.subarray(i, stop))
          this.cut = last >= 0x80 // the decoder may hold part of a character; an ASCII byte ends any
        } else this.text += buf.toString("utf8", i, stop)
        this.left -= stop - i
        i = stop
        if (this.left === 0) {
          if (this.state === RAW) this.end(false)
          else this.state = DATA_END
        }
      } else {
        const nl = buf.indexOf(10, i) // the CRLF after a chunk's data
        if (nl < 0 || nl >= end) i = end
        else {
          i = nl + 1
          this.state = SIZE
        }
      }
    }
    if (this.text.length) this.parseEvents(at)
  }

  startBody(head) {
    const status = Number(head.slice(9, 12))
    if (status !== 200) {
      if (!loggedStatuses.has(status)) {
        loggedStatuses.add(status)
        process.stderr.write(`fanout client: ${PATH} answered ${head.split("\r\n", 1)[0]}\n`)
      }
      this.end(true)
      return
    }
    const lower = head.toLowerCase()
    if (/\r\ntransfer-encoding:[^\r]*chunked/.test(lower)) this.state = SIZE
    else {
      const length = /\r\ncontent-length:\s*(\d+)/.exec(lower)
      this.state = RAW
      this.left = length ? Number(length[1]) : Infinity
      if (this.left === 0) this.end(false)
    }
  }

  // SSE lines end in "\n" or "\r\n" (a lone "\r" is not supported); a blank line ends an event.
  parseEvents(at) {
    const text = this.text
    let pos = 0
    let nl
    while ((nl = text.indexOf("\n", pos)) >= 0) {
      let stop = nl
      if (stop > pos && text.charCodeAt(stop - 1) === 13) stop--
      if (stop === pos) {
        try {
          this.dispatch(at)
        } catch {
          this.end(true) // not the JSON we expected: drop the connection, resume from the last offset
          return
        }
      } else if (text.charCodeAt(pos) !== 58) { // ":" starts a comment
        let colon = text.indexOf(":", pos)
        if (colon < 0 || colon > stop) colon = stop
        let value = colon + 1
        if (text.charCodeAt(value) === 32) value++
        const field = text.slice(pos, colon)
        if (field === "data") {
          const part = value <= stop ? text.slice(value, stop) : ""
          this.data = this.data === null ? part : this.data + "\n" + part
        } else if (field === "event") this.event = value <= stop ? text.slice(value, stop) : ""
      }
      pos = nl + 1
      if (this.over) return
    }
    this.text = pos === 0 ? text : text.slice(pos)
  }

  dispatch(at) {
    const { event, data } = this
    this.event = ""
    this.data = null
    if (data === null) return
    const sub = this.sub
    if (event === "control") {
      const control = quickControl(data) ?? JSON.parse(data)
      if (control.streamNextOffset) sub.offset = control.streamNextOffset
      if (!sub.ready) {
        sub.ready = true
        if (++readyCount === COUNT) markReady()
      }
      if (control.streamClosed) {
        sub.closed = true
        this.end(false)
      }
    } else if (event === "data") {
      const parsed = JSON.parse(data)
      for (const message of Array.isArray(parsed) ? parsed : [parsed]) {
        sub.see(message.seq, at - message.t * 1000)
      }
    }
  }
}

// Control events are half of all events and only their offset matters: read it without JSON.parse
// when the event is compact and plain (no escapes, not closed); anything else takes JSON.parse.
const OFFSET_KEY = '"streamNextOffset":"'
function quickControl(data) {
  const key = data.indexOf(OFFSET_KEY)
  if (key < 0 || data.includes("\\") || data.includes("streamClosed")) return null
  const start = key + OFFSET_KEY.length
  const stop = data.indexOf('"', start)
  return stop < 0 ? null : { streamNextOffset: data.slice(start, stop) }
}

function markReady() {
  cpuAtReady = process.cpuUsage()
  process.stdout.write("ready\n")
}

let finished = false
const subs = Array.from({ length: COUNT }, () => new Subscriber())
for (const sub of subs) sub.connect()
if (COUNT === 0) markReady()

// Nearest rank, as app/bench/stats.percentile: the smallest value with pct% at or below it.
function percentile(sorted, pct) {
  if (sorted.length === 0) return null
  return sorted[Math.max(Math.ceil((pct / 100) * sorted.length), 1) - 1]
}

function finish() {
  finished = true
  const cpu = process.cpuUsage(cpuAtReady ?? undefined)
  const sorted = latencies.subarray(0, latencyCount).sort()
  const result = {
    subscribers: COUNT,
    delivered: subs.reduce((n, s) => n + s.distinct, 0),
    duplicates: subs.reduce((n, s) => n + s.duplicates, 0),
    reconnects: subs.reduce((n, s) => n + s.reconnects, 0),
    p50_ms: percentile(sorted, 50),
    p90_ms: percentile(sorted, 90),
    p99_ms: percentile(sorted, 99),
    max_ms: percentile(sorted, 100),
    cpu_seconds: (cpu.user + cpu.system) / 1e6,
  }
  process.stdout.write(JSON.stringify(result) + "\n", () => process.exit(0))
}

function drain() {
  const deadline = Date.now() + DRAIN_MS
  const check = () => {
    if (Date.now() >= deadline || subs.every((s) => s.closed || s.distinct >= sent)) finish()
    else setTimeout(check, 50)
  }
  check()
}

let input = ""
process.stdin.setEncoding("utf8")
process.stdin.on("data", (chunk) => {
  input += chunk
  let nl
  while ((nl = input.indexOf("\n")) >= 0) {
    const [command, arg] = input.slice(0, nl).trim().split(/\s+/)
    input = input.slice(nl + 1)
    if (command === "stop" && sent < 0) {
      sent = Number(arg)
      drain()
    }
  }
})
process.stdin.on("end", () => {
  if (sent < 0) process.exit(1) // the parent went away without asking for results
})
