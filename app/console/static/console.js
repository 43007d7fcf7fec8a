// The console's page: buckets and streams, a stream's metadata, a live tail, an append box, and the
// cluster's and tiering's state. Everything it shows comes from Rill's public HTTP API (api.js).
// Every value is rendered with textContent (see el()): nothing from the server becomes markup.

import {
  ApiError,
  LiveTail,
  base64ToBytes,
  bucketUrl,
  bytesToBase64,
  getJson,
  getToken,
  hexDump,
  hexToBytes,
  isBinary,
  isBuiltin,
  isJson,
  query,
  request,
  setToken,
  streamUrl,
} from "./api.js";

const $ = (id) => document.getElementById(id);

const PAGE_SIZE = Math.min(1000, Math.max(1, parseInt(new URLSearchParams(location.search).get("limit"), 10) || 50));
const TAIL_MAX_ENTRIES = 500;
const PREVIEW_BYTES = 4096; // of a binary batch, shown as hex and base64
const SNAPSHOT_PREVIEW_BYTES = 16384;
const REFRESH_MS = 5000; // the cluster and tiering views, while shown

const state = {
  bucket: null,
  stream: null, // {name, content_type, created_at, ...} from the listing
  contentType: "",
  bucketNext: null,
  streamNext: null,
  listed: new Map(), // the streams listed for the bucket, by name
  tail: null,
  nextOffsetCell: null,
  refreshTimer: null,
  statusTimer: null,
  view: "streams",
};

// ---- rendering helpers ---------------------------------------------------------------------

function el(tag, props, ...children) {
  const node = document.createElement(tag);
  for (const [key, value] of Object.entries(props || {})) {
    if (value === undefined || value === null || value === false) continue;
    if (key === "className") node.className = value;
    else if (key === "dataset") Object.assign(node.dataset, value);
    else if (key === "text") node.textContent = value;
    else node.setAttribute(key, value === true ? "" : String(value));
  }
  for (const child of children) {
    if (child === undefined || child === null || child === false) continue;
    node.append(child instanceof Node ? child : document.createTextNode(String(child)));
  }
  return node;
}

function show(value) {
  if (value === undefined || value === null || value === "") return "—";
  if (value === true) return "yes";
  if (value === false) return "no";
  if (typeof value === "object") return JSON.stringify(value);
  return String(value);
}

function bytes(n) {
  if (typeof n !== "number") return show(n);
  const units = ["B", "KiB", "MiB", "GiB", "TiB"];
  let value = n;
  let unit = 0;
  while (value >= 1024 && unit < units.length - 1) {
    value /= 1024;
    unit += 1;
  }
  return (unit ? value.toFixed(1) : String(value)) + " " + units[unit];
}

function when(iso) {
  if (!iso) return "—";
  const date = new Date(iso);
  return Number.isNaN(date.getTime()) ? String(iso) : date.toLocaleString();
}

// Fills a <dl> with [label, value, title?] rows; returns the value cells by label.
function fillPairs(dl, rows) {
  dl.replaceChildren();
  const cells = {};
  for (const [label, value, title, className] of rows) {
    const dd = el("dd", { title, className }, show(value));
    dl.append(el("div", {}, el("dt", {}, label), dd));
    cells[label] = dd;
  }
  return cells;
}

// ---- status line ---------------------------------------------------------------------------

function describe(error) {
  if (error instanceof ApiError) {
    let text = error.status ? `${error.status} ${error.code}: ${error.message}` : error.message;
    if (error.status === 401) text += " — enter a token in the header bar.";
    else if (error.status === 403) text += " — the token's scopes do not allow this.";
    return text;
  }
  return (error && error.message) || String(error);
}

function setStatus(kind, message) {
  const status = $("status");
  clearTimeout(state.statusTimer);
  status.className = "status " + kind;
  status.textContent = message;
  status.hidden = false;
  if (kind !== "error") state.statusTimer = setTimeout(() => { status.hidden = true; }, 6000);
}

function reportError(error, context) {
  if (error && error.name === "AbortError") return;
  setStatus("error", (context ? context + ": " : "") + describe(error));
}

// Wraps an event handler: its errors go to the status line, never out of the page.
function guard(handler, context) {
  return (event) => {
    if (event && event.type === "submit") event.preventDefault();
    Promise.resolve()
      .then(() => handler(event))
      .catch((error) => reportError(error, context));
  };
}

// ---- buckets -------------------------------------------------------------------------------

async function loadBuckets(more = false) {
  const prefix = $("bucket-prefix").value.trim();
  const list = $("bucket-list");
  let page;
  try {
    page = await getJson("/ds" + query({ prefix, after: more ? state.bucketNext : "", limit: PAGE_SIZE }));
  } catch (error) {
    if (error instanceof ApiError && (error.status === 401 || error.status === 403)) {
      list.replaceChildren(); // nothing this token (or none) may see
      $("bucket-more").hidden = true;
    }
    throw error;
  }
  if (!more) list.replaceChildren();
  for (const bucket of page.buckets || []) list.append(bucketItem(bucket));
  if (!list.children.length) list.append(el("li", { className: "none" }, prefix ? "No bucket starts with that." : "No buckets yet."));
  state.bucketNext = page.has_more ? page.next : null;
  $("bucket-more").hidden = !page.has_more;
}

function bucketItem(bucket) {
  const button = el(
    "button",
    { type: "button", className: "item", dataset: { bucket: bucket.name }, "aria-current": bucket.name === state.bucket ? "true" : null, title: bucket.created_at ? "created " + when(bucket.created_at) : null },
    el("span", { className: "name" }, bucket.name),
    bucket.builtin ? el("span", { className: "tag" }, "built-in") : null,
  );
  button.addEventListener("click", guard(() => selectBucket(bucket.name), "Bucket"));
  return el("li", {}, button);
}

function markCurrent(list, key, value) {
  for (const button of list.querySelectorAll("button.item")) {
    if (button.dataset[key] === value) button.setAttribute("aria-current", "true");
    else button.removeAttribute("aria-current");
  }
}

async function selectBucket(name) {
  if (state.bucket !== name) {
    closeStream();
    state.bucket = name;
    $("stream-prefix").value = "";
  }
  markCurrent($("bucket-list"), "bucket", name);
  $("streams-panel").hidden = false;
  $("streams-bucket").textContent = name;
  remember();
  await loadStreams();
}

async function createBucket() {
  const name = $("new-bucket").value.trim();
  const retention = $("new-bucket-retention").value.trim();
  const headers = retention ? { "Stream-Retention": retention } : {};
  const response = await request("PUT", bucketUrl(name), { headers });
  setStatus("ok", response.status === 201 ? `Created bucket ${name}.` : `Bucket ${name} already exists.`);
  $("new-bucket").value = "";
  $("new-bucket-retention").value = "";
  $("bucket-prefix").value = "";
  await loadBuckets();
  await selectBucket(name);
}

// ---- streams -------------------------------------------------------------------------------

async function loadStreams(more = false) {
  const bucket = state.bucket;
  if (!bucket) return;
  const prefix = $("stream-prefix").value.trim();
  const page = await getJson(bucketUrl(bucket) + query({ prefix, after: more ? state.streamNext : "", limit: PAGE_SIZE }));
  if (bucket !== state.bucket) return; // another bucket was picked meanwhile
  const list = $("stream-list");
  if (!more) {
    list.replaceChildren();
    state.listed.clear();
  }
  for (const stream of page.streams || []) {
    state.listed.set(stream.name, stream);
    list.append(streamItem(stream));
  }
  if (!list.children.length) list.append(el("li", { className: "none" }, prefix ? "No stream starts with that." : "No streams yet."));
  state.streamNext = page.has_more ? page.next : null;
  $("stream-more").hidden = !page.has_more;
}

function streamItem(stream) {
  const button = el(
    "button",
    { type: "button", className: "item", dataset: { stream: stream.name }, "aria-current": state.stream && stream.name === state.stream.name ? "true" : null, title: "next offset " + stream.next_offset },
    el("span", { className: "name" }, stream.name),
    el("span", { className: "sub" }, stream.content_type || ""),
    stream.closed ? el("span", { className: "tag" }, "closed") : null,
  );
  button.addEventListener("click", guard(() => selectStream(stream), "Stream"));
  return el("li", {}, button);
}

async function createStream() {
  const name = $("new-stream").value.trim();
  const contentType = $("new-stream-type").value.trim() || "application/octet-stream";
  const response = await request("PUT", streamUrl(state.bucket, name), { headers: { "Content-Type": contentType } });
  setStatus("ok", response.status === 201 ? `Created stream ${name}.` : `Stream ${name} already exists.`);
  $("new-stream").value = "";
  await loadStreams();
  await selectStream({ name, content_type: contentType });
}

function closeStream() {
  stopTail();
  state.stream = null;
  state.contentType = "";
  $("stream-detail").hidden = true;
  $("empty-detail").hidden = false;
}

async function selectStream(stream) {
  stopTail();
  if (!state.stream || state.stream.name !== stream.name) $("tail-log").replaceChildren();
  state.stream = stream;
  state.contentType = stream.content_type || "";
  markCurrent($("stream-list"), "stream", stream.name);
  $("empty-detail").hidden = true;
  $("stream-detail").hidden = false;
  $("stream-title").textContent = stream.name;
  remember();
  await loadDetails();
}

async function loadDetails() {
  const { bucket, stream } = state;
  if (!stream) return;
  const url = streamUrl(bucket, stream.name);
  const head = await request("HEAD", url);
  if (state.stream !== stream) return;
  const h = (name) => head.headers.get(name);
  state.contentType = h("Content-Type") || state.contentType;
  $("stream-type").textContent = state.contentType;
  const optional = (label, value) => (value ? [[label, value]] : []);
  const cells = fillPairs($("stream-meta"), [
    ["Next offset", h("Stream-Next-Offset")],
    ["Earliest offset", h("Stream-Earliest-Offset"), "history before it was discarded by retention"],
    ["Closed", h("Stream-Closed") === "true"],
    ...optional("TTL", h("Stream-TTL") && h("Stream-TTL") + " s"),
    ...optional("Expires at", h("Stream-Expires-At")),
    ...optional("Retention", h("Stream-Retention")),
    ...optional("Snapshot at", h("Stream-Snapshot-Offset")),
    ...optional("Created", stream.created_at && when(stream.created_at)),
  ]);
  state.nextOffsetCell = cells["Next offset"];
  setupAppend();
  if (isBuiltin(bucket)) {
    $("stream-attrs").textContent = "Attributes, snapshots and retention are on /ds streams only.";
    fillPairs($("stream-snapshot"), []);
    $("snapshot-preview").hidden = true;
    return;
  }
  // Each part on its own: a snapshot the browser cannot fetch (a redirect to another origin, which
  // the page's CSP forbids) must not hide the attributes, nor the other way round.
  await Promise.all([
    loadAttrs(url, stream).catch((error) => partFailed("stream-attrs", stream, error)),
    loadSnapshot(url, stream).catch((error) => partFailed("stream-snapshot", stream, error)),
  ]);
}

function partFailed(id, stream, error) {
  if (state.stream === stream) $(id).textContent = `could not load: ${error.message || error}`;
}

async function loadAttrs(url, stream) {
  const attrs = await getJson(url + "/attrs");
  if (state.stream !== stream) return;
  const empty = attrs && typeof attrs === "object" && !Object.keys(attrs).length;
  $("stream-attrs").textContent = empty ? "none set" : JSON.stringify(attrs, null, 2);
}

async function loadSnapshot(url, stream) {
  const preview = $("snapshot-preview");
  preview.hidden = true;
  let head;
  try {
    head = await request("HEAD", url + "/snapshot"); // 307 to the latest snapshot, followed
  } catch (error) {
    if (error instanceof ApiError && error.status === 404) {
      if (state.stream === stream) fillPairs($("stream-snapshot"), [["Latest", "none published"]]);
      return;
    }
    throw error;
  }
  if (state.stream !== stream) return;
  const h = (name) => head.headers.get(name);
  const size = parseInt(h("Content-Length") || "", 10);
  const type = h("Content-Type") || "";
  fillPairs($("stream-snapshot"), [
    ["Offset", h("Stream-Snapshot-Offset")],
    ["Digest", h("Stream-Snapshot-Digest"), h("Stream-Snapshot-Digest"), "clip"],
    ["Content", [type, Number.isNaN(size) ? null : bytes(size)].filter(Boolean).join(" · ")],
  ]);
  if (!Number.isNaN(size) && size <= SNAPSHOT_PREVIEW_BYTES && !isBinary(type)) {
    const body = await (await request("GET", head.url)).text();
    if (state.stream !== stream) return;
    preview.textContent = isJson(type) ? pretty(body) : body;
    preview.hidden = false;
  }
}

// A run of 16 or more digits may be an integer JSON.parse cannot hold exactly.
const UNSAFE_INTEGER = /\d{16,}/;

function pretty(text) {
  if (UNSAFE_INTEGER.test(text)) return text;
  try {
    return JSON.stringify(JSON.parse(text), null, 2);
  } catch {
    return text;
  }
}

// ---- live tail -----------------------------------------------------------------------------

function startTail() {
  stopTail();
  const { bucket, stream } = state;
  if (!stream) return;
  const from = $("tail-from").value;
  const offset = from === "custom" ? $("tail-offset").value.trim() : from;
  if (!offset) {
    setStatus("error", "Live tail: give an offset to start from.");
    return;
  }
  const tail = new LiveTail(streamUrl(bucket, stream.name), offset, state.contentType, {
    onBatch: (batch) => renderBatch(batch),
    onControl: (control) => {
      if (state.tail === tail && state.nextOffsetCell && control.streamNextOffset) {
        state.nextOffsetCell.textContent = control.streamNextOffset;
      }
    },
    onState: (name, detail) => {
      if (state.tail !== tail) return;
      setTailState(name, detail);
      if (name === "failed") reportError(detail, "Live tail");
    },
  });
  state.tail = tail;
  tail.start();
}

function stopTail() {
  const tail = state.tail;
  if (tail) tail.stop();
  state.tail = null;
  setTailState("stopped");
}

function setTailState(name, detail) {
  const pill = $("tail-state");
  pill.textContent = name;
  pill.className = "pill state-" + name;
  pill.title = detail ? describe(detail) : "";
  const active = ["connecting", "live", "reconnecting"].includes(name);
  $("tail-stop").disabled = !active;
}

function renderBatch({ data, binary, to }) {
  const log = $("tail-log");
  const atBottom = log.scrollHeight - log.scrollTop - log.clientHeight < 40;
  const body = [];
  let count;
  if (binary) {
    let raw;
    try {
      raw = base64ToBytes(data);
    } catch {
      raw = null;
    }
    if (raw) {
      const shown = raw.subarray(0, PREVIEW_BYTES);
      const more = raw.length > shown.length ? `\n… ${raw.length - shown.length} more bytes` : "";
      count = bytes(raw.length);
      body.push(el("pre", { className: "msg hex", title: "hex" }, hexDump(shown) + more));
      body.push(el("pre", { className: "msg b64", title: "base64" }, "base64 " + bytesToBase64(shown) + (more ? " …" : "")));
    } else {
      count = "undecodable";
      body.push(el("pre", { className: "msg bad" }, data));
    }
  } else if (isJson(state.contentType)) {
    let messages;
    try {
      const parsed = JSON.parse(data);
      messages = Array.isArray(parsed) ? parsed : [parsed];
    } catch {
      messages = null;
    }
    if (messages && UNSAFE_INTEGER.test(data)) {
      // JSON.parse would round integers past 2^53: show the text as the server sent it.
      count = messages.length === 1 ? "1 message" : `${messages.length} messages`;
      body.push(el("pre", { className: "msg json" }, data));
    } else if (messages) {
      count = messages.length === 1 ? "1 message" : `${messages.length} messages`;
      for (const message of messages) body.push(el("pre", { className: "msg json" }, JSON.stringify(message, null, 2)));
    } else {
      count = "not JSON";
      body.push(el("pre", { className: "msg bad" }, data));
    }
  } else {
    count = `${data.length} chars`;
    body.push(el("pre", { className: "msg text" }, data));
  }
  const head = el(
    "div",
    { className: "entry-head" },
    el("time", {}, new Date().toLocaleTimeString()),
    el("span", { className: "count" }, count),
    el("span", { className: "offset", title: "the stream's next offset after this batch" }, to ? "→ " + to : ""),
  );
  log.append(el("li", { className: "entry" }, head, ...body));
  while (log.children.length > TAIL_MAX_ENTRIES) log.firstElementChild.remove();
  if (atBottom) log.scrollTop = log.scrollHeight;
}

// ---- append --------------------------------------------------------------------------------

function setupAppend() {
  const type = state.contentType;
  const encoding = $("append-encoding");
  const input = $("append-body");
  encoding.hidden = !isBinary(type);
  if (isJson(type)) {
    input.placeholder = '{"hello": "world"}';
    $("append-hint").textContent = "JSON: one value, or an array of messages.";
  } else if (isBinary(type)) {
    input.placeholder = encoding.value === "base64" ? "3q2+7w==" : encoding.value === "hex" ? "de ad be ef" : "text";
    $("append-hint").textContent = `Bytes as ${type}.`;
  } else {
    input.placeholder = "text";
    $("append-hint").textContent = `Sent as ${type}.`;
  }
}

function appendBody() {
  const text = $("append-body").value;
  const type = state.contentType;
  if (isJson(type)) {
    try {
      JSON.parse(text);
    } catch (error) {
      throw new Error("not valid JSON: " + error.message);
    }
    return text;
  }
  if (isBinary(type)) {
    const encoding = $("append-encoding").value;
    if (encoding === "hex") return hexToBytes(text);
    if (encoding === "base64") {
      try {
        return base64ToBytes(text);
      } catch {
        throw new Error("not base64");
      }
    }
    return new TextEncoder().encode(text);
  }
  return text;
}

async function append() {
  const { bucket, stream } = state;
  if (!stream) return;
  const body = appendBody();
  if (!body.length) throw new Error("nothing to append");
  const response = await request("POST", streamUrl(bucket, stream.name), {
    body,
    headers: { "Content-Type": state.contentType || "application/octet-stream" },
  });
  const next = response.headers.get("Stream-Next-Offset");
  if (next && state.nextOffsetCell && state.stream === stream) state.nextOffsetCell.textContent = next;
  $("append-body").value = "";
  setStatus("ok", `Appended to ${stream.name}` + (next ? `; next offset ${next}.` : "."));
}

// ---- cluster and tiering -------------------------------------------------------------------

const NEEDS_ADMIN = "Only an admin token (admin:*) sees this while auth is on: enter one in the header bar.";

async function loadCluster() {
  const note = $("cluster-note");
  const rows = $("cluster-nodes");
  let nodes;
  try {
    nodes = (await getJson("/_rill/cluster")).nodes || [];
    note.textContent = "";
  } catch (error) {
    if (error instanceof ApiError && (error.status === 401 || error.status === 403)) {
      rows.replaceChildren();
      note.textContent = `The cluster view needs an admin token (admin:*): ${describe(error)}`;
      return;
    }
    if (!(error instanceof ApiError && (error.status === 404 || error.status === 405))) throw error;
    nodes = await nodesFromHealth(note);
  }
  rows.replaceChildren();
  for (const node of nodes) {
    const leader = node.role === "leader";
    rows.append(
      el(
        "tr",
        { className: leader ? "leader" : node.reachable === false ? "down" : null },
        el("td", {}, show(node.id)),
        el("td", { className: "mono" }, show(node.url)),
        el("td", {}, show(node.reachable)),
        el("td", {}, el("span", { className: "pill role-" + (node.role || "unknown") }, show(node.role))),
        el("td", {}, show(node.term)),
        el("td", {}, show(node.leader)),
        el("td", {}, show(node.commit)),
        el("td", {}, show(node.applied)),
        el("td", {}, show(node.last_index)),
        el("td", {}, show(node.lag)),
      ),
    );
  }
}

// Without /_rill/cluster: this node's own /healthz, and its peers by URL only.
async function nodesFromHealth(note) {
  const health = await getJson("/healthz");
  if (health.role === undefined) {
    note.textContent = NEEDS_ADMIN;
    return [];
  }
  note.textContent = "This server has no /_rill/cluster: the state shown is this node's /healthz.";
  const self = {
    id: health.node,
    url: (health.peers && health.peers[String(health.node)]) || location.origin,
    reachable: true,
    role: health.role,
    term: health.term,
    leader: health.leader,
    commit: health.commit,
    applied: health.applied,
    last_index: health.last_index,
    lag: health.last_index - health.applied,
  };
  const peers = Object.entries(health.peers || {})
    .filter(([id]) => id !== String(health.node))
    .map(([id, url]) => ({ id: Number(id), url }));
  return [self, ...peers];
}

async function loadTiering() {
  const health = await getJson("/healthz");
  const note = $("tiering-note");
  const tiering = health.tiering;
  if (!tiering) {
    note.textContent = NEEDS_ADMIN;
    fillPairs($("tiering-state"), []);
    fillPairs($("disk-state"), []);
    $("tiering-failing").hidden = $("tiering-failing-heading").hidden = $("disk-heading").hidden = true;
    return;
  }
  note.textContent = tiering.available === false ? "The object store is unavailable: tiering waits for it." : "";
  fillPairs($("tiering-state"), [
    ["Store", tiering.store],
    ["Available", tiering.available],
    ["Last error", tiering.last_error],
    ["Untiered", bytes(tiering.untiered_bytes), show(tiering.untiered_bytes) + " bytes"],
    ["Local", bytes(tiering.local_bytes), show(tiering.local_bytes) + " bytes"],
    ["Deletion queue", tiering.deletion_queue],
    ["Segments uploaded", tiering.segments_uploaded],
    ["Failing streams", tiering.failing_count],
    ["Failing deletions", tiering.deletions_failing_count],
  ]);
  const failing = [...(tiering.failing || []), ...(tiering.deletions_failing || [])];
  $("tiering-failing").textContent = JSON.stringify(failing, null, 2);
  $("tiering-failing").hidden = $("tiering-failing-heading").hidden = !failing.length;
  const disk = health.disk && typeof health.disk === "object" ? health.disk : null;
  $("disk-heading").hidden = !disk;
  fillPairs($("disk-state"), disk ? Object.entries(disk).map(([key, value]) => [key.replaceAll("_", " "), /bytes$/.test(key) ? bytes(value) : value]) : []);
}

// ---- views, token, navigation ------------------------------------------------------------

const LOADERS = { cluster: loadCluster, tiering: loadTiering };

function showView(view) {
  state.view = view;
  for (const tab of document.querySelectorAll("[role=tab]")) tab.setAttribute("aria-selected", String(tab.dataset.view === view));
  for (const name of ["streams", "cluster", "tiering"]) $("view-" + name).hidden = name !== view;
  clearInterval(state.refreshTimer);
  state.refreshTimer = null;
  const load = LOADERS[view];
  if (load) {
    guard(load, view === "cluster" ? "Cluster" : "Tiering")();
    state.refreshTimer = setInterval(() => {
      if (!document.hidden) load().catch((error) => reportError(error, view === "cluster" ? "Cluster" : "Tiering"));
    }, REFRESH_MS);
  }
}

function reloadAll() {
  const context = "Buckets";
  loadBuckets().catch((error) => reportError(error, context));
  if (state.bucket) loadStreams().catch((error) => reportError(error, "Streams"));
  if (state.stream) loadDetails().catch((error) => reportError(error, "Stream"));
  if (LOADERS[state.view]) showView(state.view);
}

function remember() {
  const params = new URLSearchParams();
  if (state.bucket) params.set("bucket", state.bucket);
  if (state.stream) params.set("stream", state.stream.name);
  const hash = params.toString();
  history.replaceState(null, "", location.pathname + location.search + (hash ? "#" + hash : ""));
}

async function restore() {
  const params = new URLSearchParams(location.hash.slice(1));
  const bucket = params.get("bucket");
  const stream = params.get("stream");
  if (!bucket) return;
  await selectBucket(bucket);
  if (stream) await selectStream(state.listed.get(stream) || { name: stream });
}

function wire() {
  window.addEventListener("unhandledrejection", (event) => {
    event.preventDefault();
    reportError(event.reason, "Unexpected error");
  });

  $("status").addEventListener("click", () => { $("status").hidden = true; });
  for (const tab of document.querySelectorAll("[role=tab]")) tab.addEventListener("click", () => showView(tab.dataset.view));

  $("token").value = getToken();
  $("token-form").addEventListener("submit", (event) => {
    event.preventDefault();
    setToken($("token").value.trim());
    setStatus("info", getToken() ? "Token set for this tab." : "No token: requests go without one.");
    reloadAll();
  });
  $("token-clear").addEventListener("click", () => {
    $("token").value = "";
    setToken("");
    setStatus("info", "Token cleared.");
    reloadAll();
  });

  $("bucket-search").addEventListener("submit", guard(() => loadBuckets(), "Buckets"));
  $("bucket-refresh").addEventListener("click", guard(() => loadBuckets(), "Buckets"));
  $("bucket-more").addEventListener("click", guard(() => loadBuckets(true), "Buckets"));
  $("bucket-create").addEventListener("submit", guard(createBucket, "Create bucket"));

  $("stream-search").addEventListener("submit", guard(() => loadStreams(), "Streams"));
  $("stream-list-refresh").addEventListener("click", guard(() => loadStreams(), "Streams"));
  $("stream-more").addEventListener("click", guard(() => loadStreams(true), "Streams"));
  $("stream-create").addEventListener("submit", guard(createStream, "Create stream"));

  $("stream-refresh").addEventListener("click", guard(loadDetails, "Stream"));
  $("tail-from").addEventListener("change", () => { $("tail-offset").hidden = $("tail-from").value !== "custom"; });
  $("tail-form").addEventListener("submit", guard(startTail, "Live tail"));
  $("tail-stop").addEventListener("click", () => stopTail());
  $("tail-clear").addEventListener("click", () => $("tail-log").replaceChildren());

  $("append-encoding").addEventListener("change", setupAppend);
  $("append-form").addEventListener("submit", guard(append, "Append"));
  $("append-body").addEventListener("keydown", (event) => {
    if (event.key === "Enter" && (event.ctrlKey || event.metaKey)) $("append-form").requestSubmit();
  });

  $("cluster-refresh").addEventListener("click", guard(loadCluster, "Cluster"));
  $("tiering-refresh").addEventListener("click", guard(loadTiering, "Tiering"));
}

wire();
loadBuckets()
  .then(restore)
  .catch((error) => reportError(error, "Buckets"))
  .finally(() => document.body.setAttribute("data-ready", "true"));
