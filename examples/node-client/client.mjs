// Submit, follow and cancel a gpuorch workload from Node with the official nats.js client,
// using only docs/contract.md and proto/schemas/ (no gpuorch code).
//
//   NATS_URL=nats://127.0.0.1:4222 node client.mjs workload.json [--cancel-after running|attempt-created|submitted]
//       [--key header|body|both|conflict] [--resend]
//
// --key: where the submit's idempotency key goes (contract.md, Submit): the Nats-Msg-Id header
// (the default), `idempotency_key` in the body only, both (the same key), or both with different
// keys (`conflict`: refused, the client expects the record saying so). --resend: once the workload
// is `submitted`, publish the very same submit again (it must name the same workload, not a second).
//
// Environment: NATS_URL (default nats://127.0.0.1:4222), GPUORCH_PREFIX (default gpuorch),
// GPUORCH_NATS_CREDS (an nkey seed file or a .creds file, when the server requires one),
// SCHEMA_DIR (default ../../proto/schemas), TIMEOUT_S (default 120).
// Prints one JSON line per event it sees ({"seq", "subject", "type", ...}) and a last line
// {"result": ...}; exits 0 when the workload ended as expected (cancelled, or completed without
// --cancel-after; with --key conflict, the submit's `rejected` record), 1 otherwise, 2 when the
// document is invalid or an option unknown.

import { createHash, randomUUID, randomBytes } from "node:crypto";
import fs from "node:fs";
import path from "node:path";
import { fileURLToPath } from "node:url";
import Ajv2020 from "ajv/dist/2020.js";
import {
  connect, headers, nkeyAuthenticator, credsAuthenticator, JSONCodec, AckPolicy, DeliverPolicy, nanos,
} from "nats";
import { fromSeed } from "nkeys.js";

const here = path.dirname(fileURLToPath(import.meta.url));
const args = process.argv.slice(2);
const opts = { "--cancel-after": null, "--key": "header" };
let file = null;
let resend = false;
for (let i = 0; i < args.length; i++) {
  if (args[i] in opts) opts[args[i]] = args[++i];
  else if (args[i] === "--resend") resend = true;
  else file = args[i];
}
const cancelAfter = opts["--cancel-after"];
const KEY_FORMS = ["header", "body", "both", "conflict"];
if (!KEY_FORMS.includes(opts["--key"])) {
  process.stdout.write(JSON.stringify({ result: "usage", error: `--key: one of ${KEY_FORMS.join(", ")}` }) + "\n");
  process.exit(2);
}
const prefix = process.env.GPUORCH_PREFIX || "gpuorch";
const up = prefix.toUpperCase().replace(/[.-]/g, "_");
const STREAM_EVT = `${up}_EVT`;                       // contract.md: stream GPUORCH_EVT
const SUBMIT = `${prefix}.cmd.submit`;                // contract.md: Submit
const CANCEL = `${prefix}.cmd.cancel`;                // contract.md: Cancel
const TERMINAL = new Set(["completed", "cancelled", "workload-failed", "rejected"]);
const timeoutMs = 1000 * Number(process.env.TIMEOUT_S || 120);
const jc = JSONCodec();
const out = (o) => process.stdout.write(JSON.stringify(o) + "\n");

// 1. the document, checked against the published schema before anything is sent
const schemaDir = process.env.SCHEMA_DIR || path.join(here, "..", "..", "proto", "schemas");
const ajv = new Ajv2020();   // Ajv's default strict mode
const validWorkload = ajv.compile(JSON.parse(fs.readFileSync(path.join(schemaDir, "workload.schema.json"))));
const validEvent = ajv.compile(JSON.parse(fs.readFileSync(path.join(schemaDir, "event.schema.json"))));
const workload = JSON.parse(fs.readFileSync(file, "utf8"));
if (!validWorkload(workload)) {
  out({ result: "invalid", errors: validWorkload.errors });
  process.exit(2);
}

// 2. the workload id, derived from the idempotency key as contract.md says:
//    <slug(metadata.name)>-<first 10 hex of sha256(key)>
const key = `node-${randomUUID()}`;
const slug = workload.metadata.name.toLowerCase().replace(/[^a-z0-9-]+/g, "-").replace(/^-+|-+$/g, "")
  .slice(0, 30).replace(/^-+|-+$/g, "") || "wl";
const workloadId = `${slug}-${createHash("sha256").update(key).digest("hex").slice(0, 10)}`;
// W3C trace context: every span of the workload's life joins this trace
const traceId = randomBytes(16).toString("hex");
const traceparent = `00-${traceId}-${randomBytes(8).toString("hex")}-01`;

function authenticator() {
  const f = process.env.GPUORCH_NATS_CREDS;
  if (!f) return undefined;
  const text = fs.readFileSync(f);
  return text.includes("BEGIN NATS USER JWT") ? credsAuthenticator(text) : nkeyAuthenticator(new TextEncoder().encode(text.toString().trim()));
}

// docs/security.md: an nkey identity takes its replies on its own inbox, _INBOX.<public key>, and
// signs each command (Gpuorch-Identity, Gpuorch-Signature over subject \n Nats-Msg-Id \n body; the
// middle line empty when the command has no Nats-Msg-Id)
const seed = process.env.GPUORCH_NATS_CREDS && !fs.readFileSync(process.env.GPUORCH_NATS_CREDS).includes("BEGIN NATS USER JWT")
  ? fromSeed(new TextEncoder().encode(fs.readFileSync(process.env.GPUORCH_NATS_CREDS, "utf8").trim())) : null;
const inboxPrefix = seed ? `_INBOX.${seed.getPublicKey()}` : undefined;
function sign(h, subject, msgId, body) {
  if (!seed) return;
  const enc = new TextEncoder();
  const payload = Buffer.concat([enc.encode(`${subject}\n${msgId ?? ""}\n`), Buffer.from(body)]);
  h.set("Gpuorch-Identity", seed.getPublicKey());
  h.set("Gpuorch-Signature", Buffer.from(seed.sign(payload)).toString("base64"));
}

const nc = await connect({ servers: process.env.NATS_URL || "nats://127.0.0.1:4222", authenticator: authenticator(), name: "gpuorch-node-example", inboxPrefix });
const js = nc.jetstream();
const deadline = setTimeout(() => { out({ result: "timeout", workload_id: workloadId }); process.exit(1); }, timeoutMs);

// 3. follow the one workload: a consumer on GPUORCH_EVT filtered to evt.<id>.>,
//    deliver policy "all" (from the workload's first event), started
//    before the submit so nothing is missed; the server removes it when the client goes away
//    A consumer under a name of the client's own (docs/security.md: the name-less create that
//    nats.js ordered consumers use is refused on the event stream, it could rewrite a durable)
const jsm = await nc.jetstreamManager();
const consumerName = `node-${randomUUID()}`;
await jsm.consumers.add(STREAM_EVT, {
  name: consumerName, ack_policy: AckPolicy.None, deliver_policy: DeliverPolicy.All,
  filter_subject: `${prefix}.evt.${workloadId}.>`, inactive_threshold: nanos(60_000), mem_storage: true,
});
const consumer = await js.consumers.get(STREAM_EVT, consumerName);
const messages = await consumer.consume();

// 4. submit, with the idempotency key where --key puts it (contract.md: the Nats-Msg-Id header,
//    `idempotency_key` in the body, or both when they are the same); traceparent the trace
const [headerKey, bodyKey] = {
  header: [key, null], body: [null, key], both: [key, key], conflict: [key, `${key}-other`],
}[opts["--key"]];
const h = headers();
if (headerKey) h.set("Nats-Msg-Id", headerKey);
h.set("traceparent", traceparent);
const body = jc.encode({ type: "submit", schema_version: 1, workload, ...(bodyKey ? { idempotency_key: bodyKey } : {}) });
sign(h, SUBMIT, headerKey, body);
const ack = await js.publish(SUBMIT, body, { headers: h });
// a refused message is answered by a `rejected` record under msg-<stream>-<seq> of its PubAck
const recordOf = (a) => `msg-${a.stream.toLowerCase().replace(/[^a-z0-9]+/g, "-")}-${a.seq}`;
out({ published: SUBMIT, stream: ack.stream, seq: ack.seq, workload_id: workloadId, idempotency_key: key,
      key_in: opts["--key"], record: recordOf(ack), trace_id: traceId });

const expected = opts["--key"] === "conflict" ? "rejected" : cancelAfter ? "cancelled" : "completed";
let cancelled = false;
let resent = false;
const seen = [];
let finished = false;
function finish(last) {
  if (finished) return;
  finished = true;
  clearTimeout(deadline);
  out({ result: last, expected, workload_id: workloadId, events: seen });
  Promise.race([nc.close(), new Promise((r) => setTimeout(r, 1000))]).then(() => process.exit(last === expected ? 0 : 1));
}

function show(m) {
  const evt = jc.decode(m.data);
  const type = m.subject.split(".").pop();      // the subject ends in the event's type
  out({ seq: m.seq, subject: m.subject, type, schema_ok: validEvent(evt), at: evt.at, ...(evt.reason ? { reason: evt.reason } : {}),
        ...(evt.errors?.length ? { errors: evt.errors } : {}),
        ...(evt.message ? { message: evt.message } : {}), ...(evt.cluster ? { cluster: evt.cluster } : {}) });
  return type;
}

// 5. the submit's own record, if it was refused (it never reaches the workload's subjects)
await jsm.consumers.add(STREAM_EVT, {
  name: `${consumerName}-record`, ack_policy: AckPolicy.None, deliver_policy: DeliverPolicy.All,
  filter_subject: `${prefix}.evt.${recordOf(ack)}.>`, inactive_threshold: nanos(60_000), mem_storage: true,
});
const records = await (await js.consumers.get(STREAM_EVT, `${consumerName}-record`)).consume();
(async () => {
  for await (const m of records) {
    show(m);
    seen.push("rejected");
    return finish("rejected");
  }
})();

let last = null;
for await (const m of messages) {
  const type = show(m);
  seen.push(type);
  last = type;
  if (resend && !resent && type === "submitted") {
    // 6. the same submit again (a client that never saw its PubAck): the same workload. With a
    //    Nats-Msg-Id, JetStream drops it (duplicate: true); with the body's key only, the router
    //    recognises it (same key, same document) and changes nothing
    const again = await js.publish(SUBMIT, body, { headers: h });
    out({ republished: SUBMIT, stream: again.stream, seq: again.seq, duplicate: again.duplicate, record: recordOf(again) });
    resent = true;
  }
  if (!cancelled && cancelAfter && type === cancelAfter) {
    // 7. cancel: works in every state; the workload ends `cancelled` once every attempt is confirmed gone
    const ch = headers();
    ch.set("Nats-Msg-Id", `cancel-${workloadId}`);
    ch.set("traceparent", traceparent);
    const cbody = jc.encode({ type: "cancel", schema_version: 1, workload_id: workloadId, reason: "node example" });
    sign(ch, CANCEL, `cancel-${workloadId}`, cbody);
    const cack = await js.publish(CANCEL, cbody, { headers: ch });
    out({ published: CANCEL, stream: cack.stream, seq: cack.seq, record: recordOf(cack) });
    cancelled = true;
  }
  if (TERMINAL.has(type)) break;
}
finish(last);
