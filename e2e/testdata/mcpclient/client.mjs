// An MCP client on the official TypeScript SDK, driven by the e2e tests
// (mcp_ts_test.go): it starts the server named by $MCP_SERVER (a JSON
// array: program and arguments) over stdio, then reads one JSON command a
// line on stdin and writes one JSON answer a line on stdout:
//
//	{"op":"list"}                                 -> {"op":"list","tools":[...]}
//	{"op":"call","id":ID,"tool":T,"args":{...},"progress":bool}
//	                                              -> {"op":"call","id":ID,"result":{...}}
//	                                                 or {"op":"call","id":ID,"error":"..."}
//	{"op":"abort","id":ID}                        the call's AbortController aborts
//
// Progress notifications of a call come back with its answer, as
// "progress": [numbers]. $MCP_SDK_DIR is where .ci/deps installed the SDK.
import { createInterface } from 'node:readline';
import { join } from 'node:path';
import { pathToFileURL } from 'node:url';

const sdk = (p) => import(pathToFileURL(join(process.env.MCP_SDK_DIR, 'node_modules/@modelcontextprotocol/sdk/dist/esm', p)).href);
const { Client } = await sdk('client/index.js');
const { StdioClientTransport } = await sdk('client/stdio.js');

const [command, ...args] = JSON.parse(process.env.MCP_SERVER);
const transport = new StdioClientTransport({ command, args, env: process.env, stderr: 'inherit' });
const client = new Client({ name: 'agent-wrap-e2e-ts', version: '1' });
await client.connect(transport);

const say = (m) => process.stdout.write(JSON.stringify(m) + '\n');
const calls = new Map();
say({ op: 'ready', server_pid: transport.pid });

for await (const line of createInterface({ input: process.stdin })) {
	const m = JSON.parse(line);
	if (m.op === 'list') {
		const r = await client.listTools();
		say({ op: 'list', tools: r.tools });
	} else if (m.op === 'call') {
		const ac = new AbortController();
		const progress = [];
		calls.set(m.id, ac);
		const opts = { signal: ac.signal, timeout: 600000 };
		if (m.progress) {
			opts.onprogress = (p) => progress.push(p.progress);
			opts.resetTimeoutOnProgress = true;
		}
		client.callTool({ name: m.tool, arguments: m.args }, undefined, opts).then(
			(result) => say({ op: 'call', id: m.id, result, progress }),
			(err) => say({ op: 'call', id: m.id, error: String(err && err.message || err), progress }),
		);
	} else if (m.op === 'abort') {
		calls.get(m.id)?.abort('the test aborted it');
	}
}
await client.close();
