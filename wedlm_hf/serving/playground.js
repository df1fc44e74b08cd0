// The playground: streams /v1/completions and colours each chunk by the forward that settled its tokens.
// fetch + a stream reader, because EventSource cannot POST. Each SSE chunk's choice carries
// `wedlm: {forward, tokens}` (the row's forward index and how many tokens it settled: committed, or sure to commit next).
"use strict";

const $ = (id) => document.getElementById(id);
let modelId = null;
let controller = null;

// A server started with --api-key answers 401 until the key is typed into the field it then shows.
function authHeaders() {
  const key = $("api-key").value.trim();
  return key ? { Authorization: `Bearer ${key}` } : {};
}

function loadModel() {
  fetch("/v1/models", { headers: authHeaders() })
    .then((r) => {
      if (r.status === 401) { $("key-field").hidden = false; throw new Error("API key needed"); }
      return r.json();
    })
    .then((body) => { modelId = body.data[0].id; $("model").textContent = modelId; })
    .catch((e) => { $("model").textContent = `(unavailable: ${e.message})`; });
}
loadModel();
$("api-key").addEventListener("input", loadModel);

function setStatus(text, isError = false) {
  $("status").textContent = text;
  $("status").className = isError ? "error" : "";
}

function colour(forward) {
  return `hsl(${(forward * 137.508) % 360}, 75%, 84%)`;
}

function requestBody() {
  const threshold = $("threshold").value.trim();
  return {
    model: modelId || undefined,
    prompt: $("prompt").value || $("prompt").placeholder,
    max_tokens: Number($("max-tokens").value),
    temperature: Number($("temperature").value),
    stream: true,
    stream_options: { include_usage: true },
    wedlm_window_size: Number($("window").value),
    wedlm_entropy_threshold: threshold === "" || threshold.toLowerCase() === "none" ? null : Number(threshold),
    wedlm_pos_penalty_factor: Number($("penalty").value),
    wedlm_lossless: $("lossless").checked,
  };
}

async function generate() {
  const out = $("out");
  out.textContent = "";
  const stats = { tokens: 0, forwards: 0, start: performance.now(), first: null };
  const show = () => {
    const seconds = (performance.now() - stats.start) / 1000;
    $("tokens").textContent = stats.tokens;
    $("forwards").textContent = stats.forwards;
    $("tpf").textContent = stats.forwards ? (stats.tokens / stats.forwards).toFixed(2) : "–";
    $("tps").textContent = seconds > 0 ? (stats.tokens / seconds).toFixed(1) : "–";
    $("ttft").textContent = stats.first === null ? "–" : `${Math.round(stats.first)} ms`;
  };
  show();
  controller = new AbortController();
  $("send").disabled = true;
  $("stop").disabled = false;
  setStatus("streaming");
  try {
    const response = await fetch("/v1/completions", {
      method: "POST",
      headers: { "Content-Type": "application/json", ...authHeaders() },
      body: JSON.stringify(requestBody()),
      signal: controller.signal,
    });
    if (!response.ok) {
      const body = await response.json().catch(() => ({}));
      throw new Error((body.error && body.error.message) || `HTTP ${response.status}`);
    }
    const reader = response.body.pipeThrough(new TextDecoderStream()).getReader();
    let buffer = "";
    let finished = false;
    while (!finished) {
      const { value, done } = await reader.read();
      if (done) break;
      buffer += value;
      let cut;
      while ((cut = buffer.indexOf("\n\n")) >= 0) {
        const event = buffer.slice(0, cut);
        buffer = buffer.slice(cut + 2);
        const data = event.split("\n").filter((l) => l.startsWith("data: ")).map((l) => l.slice(6)).join("\n");
        if (!data) continue;
        if (data === "[DONE]") { finished = true; break; }
        const chunk = JSON.parse(data);
        if (chunk.error) throw new Error(chunk.error.message);
        if (chunk.usage) {
          stats.tokens = chunk.usage.completion_tokens;
          stats.forwards = chunk.usage.forwards;
        }
        for (const choice of chunk.choices) {
          if (choice.wedlm) {
            if (stats.first === null) stats.first = performance.now() - stats.start;
            stats.tokens += choice.wedlm.tokens;
            stats.forwards = Math.max(stats.forwards, choice.wedlm.forward);
            if (choice.text) {
              const span = document.createElement("span");
              span.textContent = choice.text;
              span.style.background = colour(choice.wedlm.forward);
              span.title = `forward ${choice.wedlm.forward}: ${choice.wedlm.tokens} token(s)`;
              out.appendChild(span);
            }
          }
          if (choice.finish_reason) setStatus(`finishing (${choice.finish_reason})`);
        }
        show();
      }
    }
    show();
    setStatus("done");
  } catch (err) {
    setStatus(err.name === "AbortError" ? "stopped" : `error: ${err.message}`, err.name !== "AbortError");
  } finally {
    $("send").disabled = false;
    $("stop").disabled = true;
    controller = null;
  }
}

$("send").addEventListener("click", generate);
$("stop").addEventListener("click", () => controller && controller.abort());
$("prompt").addEventListener("keydown", (e) => {
  if (e.key === "Enter" && (e.ctrlKey || e.metaKey)) generate();
});
