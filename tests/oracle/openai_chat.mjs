// Drives a running `dflash serve` with the official OpenAI SDK (the client people use) and prints one JSON
// summary for tests/unit/cli/serve_test.cpp:   node openai_chat.mjs BASE_URL [API_KEY]
import OpenAI from 'openai';

const [baseURL, apiKey] = process.argv.slice(2);
const client = new OpenAI({ baseURL, apiKey: apiKey ?? 'none', maxRetries: 0, timeout: 60000 });
const out = {};
const messages = [{ role: 'system', content: 'be brief' }, { role: 'user', content: 'hello there' }];

const models = await client.models.list();
out.models = models.data.map((m) => m.id);

const plain = await client.chat.completions.create({ model: out.models[0], messages, max_tokens: 10, temperature: 0 });
out.plain = {
  content: plain.choices[0].message.content,
  role: plain.choices[0].message.role,
  finish_reason: plain.choices[0].finish_reason,
  usage: plain.usage,
};

const stream = await client.chat.completions.create({
  model: out.models[0], messages, max_tokens: 10, temperature: 0, stream: true, stream_options: { include_usage: true },
});
let text = '';
let finish = null;
let usage = null;
let chunks = 0;
for await (const chunk of stream) {
  chunks += 1;
  if (chunk.usage) usage = chunk.usage;
  for (const c of chunk.choices) {
    if (c.delta?.content) text += c.delta.content;
    if (c.finish_reason) finish = c.finish_reason;
  }
}
out.stream = { content: text, finish_reason: finish, usage, chunks };

const resp = await client.responses.create({
  model: out.models[0], instructions: 'be brief', input: 'hello there', max_output_tokens: 10, temperature: 0,
});
out.responses = { output_text: resp.output_text, status: resp.status };
let rtext = '';
let rlast = null;
const rstream = await client.responses.create({
  model: out.models[0], instructions: 'be brief', input: 'hello there', max_output_tokens: 10, temperature: 0,
  stream: true,
});
for await (const ev of rstream) {
  if (ev.type === 'response.output_text.delta') rtext += ev.delta;
  rlast = ev.type;
}
out.responses_stream = { text: rtext, last: rlast };

const tools = [{ type: 'function', function: { name: 'get_weather', parameters: { type: 'object' } } }];
out.tools = {};
for (const choice of ['auto', 'required', { type: 'function', function: { name: 'get_weather' } }]) {
  const r = await client.chat.completions.create({
    model: out.models[0], messages: [{ role: 'user', content: 'weather in Paris?' }], tools, tool_choice: choice,
    max_tokens: 6, temperature: 0,
  });
  const m = r.choices[0].message;
  out.tools[typeof choice === 'string' ? choice : 'named'] = {
    role: m.role, content: m.content, tool_calls: m.tool_calls ?? null, finish_reason: r.choices[0].finish_reason,
  };
}

const cmpl = await client.completions.create({ model: out.models[0], prompt: 'The capital of', max_tokens: 5, temperature: 0 });
out.completion = { text: cmpl.choices[0].text, finish_reason: cmpl.choices[0].finish_reason, usage: cmpl.usage };

try {
  await client.chat.completions.create({ model: out.models[0], messages: [], max_tokens: 4 });
  out.error = { status: 200 };
} catch (e) {
  out.error = { status: e.status, type: e.error?.type ?? e.type, message: e.error?.message ?? e.message };
}
console.log(JSON.stringify(out));
