// chime's MCP server driven by a second, independent client: the
// TypeScript SDK's Client over its StreamableHTTPClientTransport. It runs
// the flows mcp/mcp_test.go and mcp/tasks_test.go run with the go-sdk, on
// one agent's server, prints a JSON summary on stdout, and exits 1 when a
// flow failed (2 when the whole run took too long).
//
//   CHIME_MCP_URL=http://127.0.0.1:8080/api/agents/ana/mcp \
//   CHIME_MCP_TOKEN=... node flows.mjs
//
// The URL may be given as the first argument instead; the token is read
// from the environment only (an argument would show in ps), and is never
// printed.
//
// The Tasks extension (io.modelcontextprotocol/tasks, SEP-2663) is not the
// SDK's own task support (that is the 2025-11-25 shape: tasks/result,
// params.task), so the script speaks it as a client of the extension does:
// each task call declares the extension in its request's _meta, its
// result is read with the SDK's loose ResultSchema (Client.request keeps
// every field), and tasks/get, tasks/update and tasks/cancel are requests
// of methods the SDK does not know, with the same schema.
import { Client } from '@modelcontextprotocol/sdk/client/index.js';
import { StreamableHTTPClientTransport } from '@modelcontextprotocol/sdk/client/streamableHttp.js';
import { CallToolResultSchema, ErrorCode, LATEST_PROTOCOL_VERSION, McpError, ResultSchema } from '@modelcontextprotocol/sdk/types.js';

const TASKS = 'io.modelcontextprotocol/tasks';
const CLIENT_CAPS = 'io.modelcontextprotocol/clientCapabilities';
const withTasks = { [CLIENT_CAPS]: { extensions: { [TASKS]: {} } } };

const url = process.argv[2] || process.env.CHIME_MCP_URL;
const token = process.env.CHIME_MCP_TOKEN;
if (!url || !token) {
  console.error('usage: CHIME_MCP_TOKEN=... node flows.mjs URL   (or CHIME_MCP_URL)');
  process.exit(64);
}
const budgetMs = Number(process.env.CHIME_MCPTS_BUDGET_MS || 50000);

const summary = { sdk: '@modelcontextprotocol/sdk', node: process.version, sdkLatest: LATEST_PROTOCOL_VERSION, flows: {}, http: {}, transportErrors: [] };

// The HTTP exchanges the transport made, counted by method, JSON-RPC
// method, status and content type (never a header's value: the token is
// one).
const recordingFetch = async (input, init) => {
  const res = await fetch(input, init);
  let rpc;
  try {
    const body = typeof init?.body === 'string' ? JSON.parse(init.body) : undefined;
    rpc = body?.method;
  } catch {
    // not JSON: leave rpc unset
  }
  const type = (res.headers.get('content-type') ?? '').split(';')[0];
  const key = [init?.method ?? 'GET', rpc, res.status, type].filter(Boolean).join(' ');
  summary.http[key] = (summary.http[key] ?? 0) + 1;
  return res;
};

const transport = new StreamableHTTPClientTransport(new URL(url), {
  requestInit: { headers: { Authorization: `Bearer ${token}` } },
  fetch: recordingFetch,
});
const client = new Client({ name: 'chime-mcpts', version: '1' }, { capabilities: {} });
client.onerror = (err) => summary.transportErrors.push(String(err?.message ?? err));

class Failure extends Error {}
function check(cond, msg, detail) {
  if (!cond) {
    throw new Failure(detail === undefined ? msg : `${msg}: ${JSON.stringify(detail)}`);
  }
}
const sleep = (ms) => new Promise((r) => setTimeout(r, ms));
const textOf = (res) => (res?.content ?? []).filter((c) => c.type === 'text').map((c) => c.text).join('');

// taskCall calls a tool declaring the extension and returns the raw result.
function taskCall(name, args) {
  return client.request({ method: 'tools/call', params: { name, arguments: args, _meta: withTasks } }, ResultSchema);
}
const tasksGet = (taskId) => client.request({ method: 'tasks/get', params: { taskId } }, ResultSchema);
const tasksUpdate = (taskId, inputResponses) => client.request({ method: 'tasks/update', params: { taskId, inputResponses } }, ResultSchema);
const tasksCancel = (taskId) => client.request({ method: 'tasks/cancel', params: { taskId } }, ResultSchema);

// poll follows a task with tasks/get at its pollIntervalMs until its status
// is one of want; it returns the task and how many gets it took.
async function poll(taskId, want, limitMs = 20000) {
  const deadline = Date.now() + limitMs;
  for (let gets = 1; ; gets++) {
    const t = await tasksGet(taskId);
    if (want.includes(t.status)) {
      return { task: t, gets };
    }
    check(!['completed', 'failed', 'cancelled'].includes(t.status), `task ended ${t.status}, want ${want}`, t);
    check(Date.now() < deadline, `task still ${t.status}, want ${want}`, t);
    await sleep(Math.max(t.pollIntervalMs ?? 500, 50));
  }
}

// checkTask checks a tools/call answered with the extension's Task.
function checkTask(res) {
  check(res.resultType === 'task', 'resultType', res);
  check(typeof res.taskId === 'string' && res.taskId.startsWith('mcpt_'), 'taskId', res);
  check(res.status === 'working' || res.status === 'input_required', 'status', res);
  check(Number.isInteger(res.ttlMs) && res.ttlMs > 0, 'ttlMs', res);
  check(Number.isInteger(res.pollIntervalMs) && res.pollIntervalMs > 0, 'pollIntervalMs', res);
  check(typeof res.createdAt === 'string' && typeof res.lastUpdatedAt === 'string', 'createdAt, lastUpdatedAt', res);
  check(res.result === undefined && res.inputRequests === undefined, 'a created task carries no result or inputRequests', res);
}

const flows = [
  ['tools', async () => {
    const { tools } = await client.listTools();
    const names = tools.map((t) => t.name);
    const want = ['timer_create', 'timer_get', 'timer_pause', 'wait', 'wait_for', 'wait_for_tasks', 'wait_report', 'task_start',
      'task_result', 'task_get', 'task_output', 'question_ask', 'notify_user', 'inbox_fetch', 'inbox_ack'];
    const missing = want.filter((n) => !names.includes(n));
    check(missing.length === 0, 'tools missing', missing);
    const operatorOnly = ['intervention', 'question_answer', 'token_issue', 'lifecycle_stop'].filter((n) => names.includes(n));
    check(operatorOnly.length === 0, 'operator actions offered as tools', operatorOnly);
    const schema = tools.find((t) => t.name === 'timer_create').inputSchema;
    // duration_ms or cron (a calendar timer): one of the two, neither required alone.
    check(schema.type === 'object' && schema.properties?.cron !== undefined && !(schema.required ?? []).includes('duration_ms'), 'timer_create takes duration_ms or cron', schema);
    check(schema.properties?.duration_ms !== undefined && schema.properties?.timer_id === undefined, 'timer_create properties', schema);
    return { names: names.sort(), timerCreateRequired: schema.required };
  }],
  ['timer', async () => {
    const created = await client.callTool({ name: 'timer_create', arguments: { duration_ms: 200, summary: 'ts-stretch' } });
    check(!created.isError && textOf(created).includes('"status":"active"'), 'timer_create', created);
    const t0 = Date.now();
    for (let fetches = 1; ; fetches++) {
      const res = await client.callTool({ name: 'inbox_fetch', arguments: { wait_ms: 2000 } });
      check(!res.isError, 'inbox_fetch', res);
      const text = textOf(res);
      if (text.includes('"kind":"timer_fired"') && text.includes('ts-stretch')) {
        return { timerId: created.structuredContent?.timer_id, firedSeenAfterMs: Date.now() - t0, fetches };
      }
      check(Date.now() - t0 < 20000, 'no timer_fired in the inbox', text);
    }
  }],
  ['badInput', async () => {
    const res = await client.callTool({ name: 'timer_create', arguments: { duration_ms: -5 } });
    check(res.isError === true && textOf(res).startsWith('invalid_request: duration_ms'), 'a negative duration', res);
    return { text: textOf(res) };
  }],
  ['waitBlocking', async () => {
    const t0 = Date.now();
    const res = await client.callTool({ name: 'wait', arguments: { seconds: 1 } });
    const ms = Date.now() - t0;
    check(!res.isError && textOf(res).startsWith('Wait complete. Reached '), 'a blocking wait', res);
    check(res.resultType === undefined && res.taskId === undefined, 'a client without the extension got a task', res);
    check(ms >= 900, 'the wait returned before its second', ms);
    return { ms, text: textOf(res) };
  }],
  ['waitTask', async () => {
    const t0 = Date.now();
    const res = await taskCall('wait', { seconds: 1 });
    const returnedMs = Date.now() - t0;
    checkTask(res);
    check(res.status === 'working', 'status', res);
    // What the SDK's own CallToolResult schema makes of the task (callTool
    // would return this): content defaults to [], the rest is kept.
    const asCallTool = CallToolResultSchema.safeParse(res);
    const { task, gets } = await poll(res.taskId, ['completed']);
    check(task.resultType === 'complete', 'tasks/get resultType', task);
    check(task.pollIntervalMs === undefined || task.pollIntervalMs === 0, 'a completed task still asks to be polled', task);
    const result = CallToolResultSchema.safeParse(task.result);
    check(result.success, 'the completed result is a CallToolResult', task.result);
    check(textOf(result.data).startsWith('Wait complete. Reached '), 'the completed result', task.result);
    return {
      returnedMs, created: { status: res.status, ttlMs: res.ttlMs, pollIntervalMs: res.pollIntervalMs },
      callToolSchemaKeeps: asCallTool.success ? Object.keys(asCallTool.data).sort() : String(asCallTool.error),
      gets, completedAfterMs: Date.now() - t0, text: textOf(result.data),
    };
  }],
  ['questionTask', async () => {
    const res = await taskCall('question_ask', { questions: [{ title: 'Deploy?', options: ['yes', 'no'] }] });
    checkTask(res);
    const { task } = await poll(res.taskId, ['input_required']);
    const form = task.inputRequests?.answers;
    check(form?.method === 'elicitation/create' && form.params?.mode === 'form', 'the elicitation', form);
    const field = form.params.requestedSchema?.properties?.answer_1;
    check(JSON.stringify(field?.enum) === '["yes","no"]' && field.title === 'Deploy?', 'the form field', form);
    // An answer not among the options is refused, as invalid params.
    let refused;
    try {
      await tasksUpdate(res.taskId, { answers: { action: 'accept', content: { answer_1: 'maybe' } } });
    } catch (err) {
      refused = err;
    }
    check(refused instanceof McpError && refused.code === ErrorCode.InvalidParams, 'an answer not among the options', String(refused));
    const ack = await tasksUpdate(res.taskId, { answers: { action: 'accept', content: { answer_1: 'yes' } } });
    const { task: done } = await poll(res.taskId, ['completed']);
    check(textOf(done.result).includes('Answer: yes'), 'the answered result', done.result);
    return { created: res.status, form: form.params.requestedSchema, refusedCode: refused.code, updateAck: ack, text: textOf(done.result) };
  }],
  ['cancel', async () => {
    const res = await taskCall('wait', { hours: 1 });
    checkTask(res);
    const ack = await tasksCancel(res.taskId);
    const { task } = await poll(res.taskId, ['cancelled'], 5000);
    check(task.pollIntervalMs === undefined || task.pollIntervalMs === 0, 'a cancelled task still asks to be polled', task);
    // That the wait itself ended is the Go test's to check (no tool lists
    // waits).
    return { cancelAck: ack, status: task.status, statusMessage: task.statusMessage };
  }],
  ['unknownTask', async () => {
    const out = {};
    // A request given no params goes without them (the SDK leaves the
    // member out): that is invalid params too, not a crash of the server.
    for (const [name, call] of [['get', () => tasksGet('mcpt_unknown')], ['cancel', () => tasksCancel('mcpt_unknown')],
      ['update', () => tasksUpdate('mcpt_unknown', {})], ['getWithoutParams', () => client.request({ method: 'tasks/get' }, ResultSchema)]]) {
      try {
        await call();
        out[name] = 'no error';
      } catch (err) {
        out[name] = err instanceof McpError ? err.code : String(err);
      }
    }
    check(Object.values(out).every((c) => c === ErrorCode.InvalidParams), 'an unknown task', out);
    return out;
  }],
];

async function main() {
  const t0 = Date.now();
  try {
    await client.connect(transport);
  } catch (err) {
    summary.connect = { ok: false, error: String(err?.message ?? err) };
    return false;
  }
  summary.connect = {
    ok: true, protocolVersion: transport.protocolVersion, server: client.getServerVersion(),
    tasksExtension: client.getServerCapabilities()?.extensions?.[TASKS] !== undefined, ms: Date.now() - t0,
  };
  let ok = true;
  for (const [name, flow] of flows) {
    const f0 = Date.now();
    try {
      summary.flows[name] = { ok: true, ...(await flow()), ms: Date.now() - f0 };
    } catch (err) {
      ok = false;
      summary.flows[name] = { ok: false, error: err instanceof Failure ? err.message : String(err?.stack ?? err), ms: Date.now() - f0 };
    }
  }
  await client.close();
  return ok;
}

const timer = setTimeout(() => {
  summary.ok = false;
  summary.error = `the flows took over ${budgetMs} ms`;
  console.log(JSON.stringify(summary, null, 2));
  process.exit(2);
}, budgetMs);
const ok = await main();
clearTimeout(timer);
// A transport error (an SSE GET refused other than by 405, say) fails the run.
summary.ok = ok && summary.transportErrors.length === 0;
console.log(JSON.stringify(summary, null, 2));
process.exit(summary.ok ? 0 : 1);
