// Runs the Durable Streams conformance suite against a running Rill server.
// RILL_CONFORMANCE_URL is the base URL (one route family); RILL_LONG_POLL_MS the server's long-poll timeout;
// RILL_CONFORMANCE_TOKEN, if set, a bearer token every request carries (for a server with auth on);
// RILL_CONFORMANCE_SUBSCRIPTIONS=1 runs the subscription tests too (webhooks to 127.0.0.1 allowed);
// RILL_CONFORMANCE_PAUSE_MS with RILL_CONFORMANCE_PAUSE_EVERY=N idles that long before every Nth test, so
// the server's idle connections (its keep-alive timeout) close between groups of tests.
import { runConformanceTests } from "@durable-streams/server-conformance-tests"
import { beforeEach } from "vitest"

const baseUrl = process.env.RILL_CONFORMANCE_URL
if (!baseUrl) throw new Error("set RILL_CONFORMANCE_URL")

// The suite takes no headers, but it and the client it bundles call the global fetch at request
// time: wrapping it gives every request (SSE and long-polls included) the token.
const token = process.env.RILL_CONFORMANCE_TOKEN
if (token) {
  const plainFetch = globalThis.fetch
  globalThis.fetch = (input: RequestInfo | URL, init?: RequestInit): Promise<Response> => {
    const headers = new Headers(init?.headers ?? (input instanceof Request ? input.headers : undefined))
    if (!headers.has("authorization")) headers.set("authorization", `Bearer ${token}`)
    return plainFetch(input, { ...init, headers })
  }
}

const pauseMs = Number(process.env.RILL_CONFORMANCE_PAUSE_MS ?? "0")
const pauseEvery = Number(process.env.RILL_CONFORMANCE_PAUSE_EVERY ?? "0")
if (pauseMs > 0 && pauseEvery > 0) {
  let started = 0
  beforeEach(async () => {
    started += 1
    if (started % pauseEvery === 0) await new Promise((resolve) => setTimeout(resolve, pauseMs))
  }, pauseMs + 10_000)
}

runConformanceTests({
  baseUrl,
  longPollTimeoutMs: Number(process.env.RILL_LONG_POLL_MS ?? "2000"),
  subscriptions: process.env.RILL_CONFORMANCE_SUBSCRIPTIONS === "1",
})
