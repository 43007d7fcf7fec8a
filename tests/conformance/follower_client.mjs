// Writes through the official TypeScript client to the URL it is given (a follower, in the test):
// a binary stream with every byte value, appended whole and through an idempotent producer, then
// read back. Prints one JSON line; exits non-zero on any error, or after the seconds given second
// (default 30): a client stuck retrying a 307 it cannot follow with a body would otherwise hang.
import { DurableStream, IdempotentProducer, stream } from "@durable-streams/client"

const timer = setTimeout(() => {
  console.error("timed out: the client never finished its writes")
  process.exit(3)
}, 1000 * Number(process.argv[3] ?? 30))

const url = process.argv[2]
const bytes = Uint8Array.from({ length: 256 }, (_, i) => i)
const handle = await DurableStream.create({ url, contentType: "application/octet-stream" })
await handle.append(bytes)
await handle.append(new Uint8Array([0, 255, 0]))
const producer = new IdempotentProducer(handle, "ts-follower", { epoch: 0 })
producer.append(new Uint8Array([7, 7, 7]))
await producer.flush()
await producer.close()
const res = await stream({ url, live: false })
const body = await res.body()
clearTimeout(timer)
console.log(JSON.stringify({ hex: Buffer.from(body).toString("hex") }))
