// Rill's public HTTP API as the console uses it: same origin, an optional bearer token, JSON
// errors turned into ApiError, stream URLs for every route family, and live tails over SSE.

const TOKEN_KEY = "rill.console.token";

export function getToken() {
  try {
    return sessionStorage.getItem(TOKEN_KEY) || "";
  } catch {
    return ""; // storage disabled: the console works without a token
  }
}

export function setToken(token) {
  try {
    if (token) sessionStorage.setItem(TOKEN_KEY, token);
    else sessionStorage.removeItem(TOKEN_KEY);
  } catch {
    // storage disabled: nothing to keep
  }
}

export class ApiError extends Error {
  constructor(status, code, message) {
    super(message);
    this.name = "ApiError";
    this.status = status;
    this.code = code;
  }
}

function withAuth(extra) {
  const headers = new Headers(extra || {});
  const token = getToken();
  if (token) headers.set("Authorization", "Bearer " + token);
  return headers;
}

// An ApiError from a failed response: the server's {"error": {"code", "message"}} when it sent one.
export async function errorOf(response) {
  let code = "http_" + response.status;
  let message = response.statusText || "request failed";
  let text = "";
  try {
    text = await response.text();
  } catch {
    text = "";
  }
  if (text) {
    try {
      const body = JSON.parse(text);
      const error = body && typeof body === "object" ? body.error : undefined;
      if (error && typeof error === "object") {
        if (error.code !== undefined) code = String(error.code);
        if (error.message !== undefined) message = String(error.message);
      } else if (typeof error === "string") {
        message = error;
      } else if (body && typeof body.message === "string") {
        message = body.message;
      }
    } catch {
      message = text.slice(0, 300);
    }
  }
  return new ApiError(response.status, code, message);
}

// fetch() that throws ApiError for network failures and for any status that is not 2xx.
export async function request(method, path, options = {}) {
  let response;
  try {
    response = await fetch(path, {
      method,
      headers: withAuth(options.headers),
      body: options.body,
      signal: options.signal,
      cache: "no-store",
      credentials: "same-origin",
    });
  } catch (error) {
    if (error && error.name === "AbortError") throw error;
    throw new ApiError(0, "network_error", "could not reach the server (" + (error && error.message) + ")");
  }
  if (!response.ok) throw await errorOf(response);
  return response;
}

export async function getJson(path, options) {
  const response = await request("GET", path, options);
  try {
    return await response.json();
  } catch {
    throw new ApiError(response.status, "invalid_response", "the server's answer is not JSON");
  }
}

export function query(params) {
  const search = new URLSearchParams();
  for (const [key, value] of Object.entries(params)) {
    if (value !== undefined && value !== null && value !== "") search.set(key, String(value));
  }
  const text = search.toString();
  return text ? "?" + text : "";
}

// Built-in buckets are listed under /ds, but their streams live under their own route family.
const FAMILIES = { "compat.v1": "/v1/stream/", "legacy.streams": "/streams/" };

export function isBuiltin(bucket) {
  return Object.hasOwn(FAMILIES, bucket);
}

// Stream names may hold "/" and any Unicode: each segment is percent-encoded on its own.
export function encodeName(name) {
  return name.split("/").map(encodeURIComponent).join("/");
}

export function bucketUrl(bucket) {
  return "/ds/" + encodeURIComponent(bucket);
}

export function streamUrl(bucket, name) {
  const prefix = isBuiltin(bucket) ? FAMILIES[bucket] : bucketUrl(bucket) + "/";
  return prefix + encodeName(name);
}

export function mediaType(contentType) {
  return (contentType || "").split(";")[0].trim().toLowerCase();
}

export function isJson(contentType) {
  return mediaType(contentType) === "application/json";
}

// As the server decides: anything but text/* and JSON is sent base64-encoded over SSE.
export function isBinary(contentType) {
  const media = mediaType(contentType);
  return !(media.startsWith("text/") || media === "application/json");
}

export function base64ToBytes(text) {
  const raw = atob(text.replace(/\s+/g, ""));
  const bytes = new Uint8Array(raw.length);
  for (let i = 0; i < raw.length; i++) bytes[i] = raw.charCodeAt(i);
  return bytes;
}

export function bytesToBase64(bytes) {
  let raw = "";
  for (let i = 0; i < bytes.length; i += 0x8000) raw += String.fromCharCode(...bytes.subarray(i, i + 0x8000));
  return btoa(raw);
}

export function hexToBytes(text) {
  const clean = text.replace(/0x|[\s,:]/gi, "");
  if (clean.length % 2 !== 0 || /[^0-9a-f]/i.test(clean)) throw new Error("not hex: use pairs of 0-9 a-f");
  const bytes = new Uint8Array(clean.length / 2);
  for (let i = 0; i < bytes.length; i++) bytes[i] = parseInt(clean.slice(2 * i, 2 * i + 2), 16);
  return bytes;
}

// A hex dump: 16 bytes a line, the line's byte offset first.
export function hexDump(bytes) {
  const lines = [];
  for (let i = 0; i < bytes.length; i += 16) {
    const row = Array.from(bytes.subarray(i, i + 16), (b) => b.toString(16).padStart(2, "0"));
    lines.push(i.toString(16).padStart(8, "0") + "  " + row.join(" "));
  }
  return lines.join("\n");
}

// Server-Sent Events from a response body (the text/event-stream format: events end at a blank
// line; `event:` names one, `data:` lines are joined with "\n"; comments and other fields are skipped).
export async function readEvents(body, onEvent) {
  const reader = body.pipeThrough(new TextDecoderStream()).getReader();
  const state = { buffer: "", type: "", data: [] };
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    state.buffer += value;
    takeLines(state, onEvent);
  }
}

function takeLines(state, onEvent) {
  const ends = /\r\n|\n|\r/g;
  let start = 0;
  let match;
  while ((match = ends.exec(state.buffer)) !== null) {
    if (match[0] === "\r" && match.index === state.buffer.length - 1) break; // maybe half of a CRLF
    takeLine(state, state.buffer.slice(start, match.index), onEvent);
    start = ends.lastIndex;
  }
  state.buffer = state.buffer.slice(start);
}

function takeLine(state, line, onEvent) {
  if (line === "") {
    if (state.data.length) onEvent({ type: state.type || "message", data: state.data.join("\n") });
    state.type = "";
    state.data = [];
    return;
  }
  if (line.startsWith(":")) return;
  const colon = line.indexOf(":");
  const field = colon < 0 ? line : line.slice(0, colon);
  let value = colon < 0 ? "" : line.slice(colon + 1);
  if (value.startsWith(" ")) value = value.slice(1);
  if (field === "event") state.type = value;
  else if (field === "data") state.data.push(value);
}

function sleep(ms, signal) {
  return new Promise((resolve) => {
    const timer = setTimeout(resolve, ms);
    signal.addEventListener("abort", () => { clearTimeout(timer); resolve(); }, { once: true });
  });
}

// A live tail of one stream: `GET <stream>?offset=...&live=sse`, resumed from the last control
// event's `streamNextOffset` (and cursor) whenever the server ends the response (about every
// `sse_max_seconds`) or the connection drops.
//
// It reads SSE through fetch() and parses the events itself, always, rather than with EventSource:
// EventSource cannot send an Authorization header, cannot read the response's headers
// (Stream-SSE-Data-Encoding) and reconnects on its own from its first URL rather than from the
// stream's offset. One code path serves auth on and off alike.
//
// Callbacks: onBatch({data, binary, from, to}) for each `data` event, once its control event has
// named the offset after it; onControl(control); onState("connecting"|"live"|"reconnecting"|
// "closed"|"stopped"|"failed", detail).
export class LiveTail {
  constructor(url, offset, contentType, callbacks) {
    this.url = url;
    this.offset = offset;
    this.cursor = "";
    this.contentType = contentType;
    this.callbacks = callbacks;
    this.stopper = new AbortController();
    this.running = false;
  }

  start() {
    this.running = true;
    this.run().catch((error) => this.finish("failed", error));
  }

  stop() {
    if (!this.running) return;
    this.running = false;
    this.stopper.abort();
    this.callbacks.onState("stopped");
  }

  finish(state, detail) {
    if (!this.running) return;
    this.running = false;
    this.stopper.abort();
    this.callbacks.onState(state, detail);
  }

  async run() {
    let failures = 0;
    let first = true;
    while (this.running) {
      this.callbacks.onState(first ? "connecting" : "reconnecting");
      first = false;
      let closed = false;
      let received = false;
      try {
        const url = this.url + query({ offset: this.offset, live: "sse", cursor: this.cursor });
        const response = await request("GET", url, {
          signal: this.stopper.signal,
          headers: { Accept: "text/event-stream" },
        });
        const encoding = response.headers.get("Stream-SSE-Data-Encoding");
        const binary = encoding ? encoding.toLowerCase() === "base64" : isBinary(this.contentType);
        this.callbacks.onState("live");
        failures = 0;
        let pending = [];
        await readEvents(response.body, (event) => {
          received = true;
          if (event.type === "data") {
            pending.push(event.data);
          } else if (event.type === "control") {
            const control = JSON.parse(event.data);
            const from = this.offset;
            if (control.streamNextOffset) this.offset = control.streamNextOffset;
            if (control.streamCursor) this.cursor = control.streamCursor;
            for (const data of pending) this.callbacks.onBatch({ data, binary, from, to: this.offset });
            pending = [];
            this.callbacks.onControl(control);
            if (control.streamClosed) closed = true;
          }
        });
        for (const data of pending) this.callbacks.onBatch({ data, binary, from: this.offset, to: null });
      } catch (error) {
        if (!this.running || (error && error.name === "AbortError")) return;
        const status = error instanceof ApiError ? error.status : 0;
        if (status >= 400 && status < 500 && status !== 408 && status !== 429) {
          this.finish("failed", error); // 401, 404, 410...: trying again would not help
          return;
        }
        failures += 1;
        this.callbacks.onState("reconnecting", error);
        await sleep(Math.min(500 * 2 ** failures, 15000), this.stopper.signal);
        continue;
      }
      if (closed) {
        this.finish("closed");
        return;
      }
      // The server ended the response (its SSE time limit): carry on from the last offset.
      await sleep(received ? 100 : 1000, this.stopper.signal);
    }
  }
}
