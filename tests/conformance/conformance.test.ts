// Runs the Durable Streams conformance suite against a running Rill server.
// RILL_CONFORMANCE_URL is the base URL (one route family); RILL_LONG_POLL_MS the server's long-poll timeout.
import { runConformanceTests } from "@durable-streams/server-conformance-tests"

const baseUrl = process.env.RILL_CONFORMANCE_URL
if (!baseUrl) throw new Error("set RILL_CONFORMANCE_URL")

runConformanceTests({
  baseUrl,
  longPollTimeoutMs: Number(process.env.RILL_LONG_POLL_MS ?? "2000"),
})
