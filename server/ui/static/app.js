"use strict";
// The page: a chat over /v1/chat/completions (streamed) with any model the server serves or
// any LoRA adapter it holds (the list is GET /v1/models), and the live view fed by /stats/stream. The API key, when the server wants one, goes in an
// Authorization header only (never a URL) and is kept for this tab's session only.
window.pagode = window.pagode || {};

const $ = (id) => document.getElementById(id);
const STORE = "pagode.conversations";
const KEY_STORE = "pagode.apiKey";
const live = pagode.live = { fine: [], coarse: [], signals: [], connected: false };
let config = { auth: false, model: "" };
let conversations = [];
let current = null;
let controller = null;
let statsController = null;

document.addEventListener("DOMContentLoaded", start);

async function start() {
  pagode.buildCharts($("charts"));
  bindControls();
  loadConversations();
  const response = await fetch("/ui/config.json");
  config = await response.json();
  $("model-name").textContent = config.model || "";
  $("key-box").hidden = !config.auth;
  $("api-key").value = sessionStorage.getItem(KEY_STORE) || "";
  showAuthNote();
  connectStats();
  loadModels();
}

function bindControls() {
  $("tab-chat").addEventListener("click", () => showTab("chat"));
  $("tab-live").addEventListener("click", () => showTab("live"));
  $("composer").addEventListener("submit", (event) => { event.preventDefault(); send(); });
  $("prompt").addEventListener("keydown", (event) => {
    if (event.key === "Enter" && !event.shiftKey) { event.preventDefault(); send(); }
  });
  $("stop").addEventListener("click", stop);
  $("key-box").addEventListener("submit", (event) => { event.preventDefault(); $("api-key").blur(); });
  $("new-chat").addEventListener("click", () => { newConversation(); renderConversation(); });
  $("show-json").addEventListener("change", () => { $("request-json").hidden = !$("show-json").checked; });
  $("api-key").addEventListener("change", () => {
    sessionStorage.setItem(KEY_STORE, $("api-key").value.trim());
    showAuthNote();
    connectStats();
    loadModels();
  });
  // Adapters load and models come and go at run time: the list is read again on each visit.
  $("model-pick").addEventListener("focus", loadModels);
  for (const radio of document.querySelectorAll("input[name=range]")) radio.addEventListener("change", drawLive);
}

function showTab(name) {
  $("chat-view").hidden = name !== "chat";
  $("live-view").hidden = name !== "live";
  $("tab-chat").classList.toggle("active", name === "chat");
  $("tab-live").classList.toggle("active", name === "live");
  if (name === "live") drawLive();
}

function apiKey() {
  return $("api-key").value.trim();
}

function authHeaders() {
  const key = apiKey();
  return key ? { Authorization: "Bearer " + key } : {};
}

function showAuthNote() {
  $("auth-note").textContent = config.auth && !apiKey() ? "This server needs an API key: type it here first." : "";
}

// ---- which model: the served models and their adapters ----

async function loadModels() {
  if (config.auth && !apiKey()) return;  // /v1/models obeys the key: not asked keyless
  let cards;
  try {
    const response = await fetch("/v1/models", { headers: authHeaders() });
    if (!response.ok) return;
    cards = (await response.json()).data || [];
  } catch { return; }
  const pick = $("model-pick");
  const chosen = pick.value || config.model || (cards[0] && cards[0].id) || "";
  pick.replaceChildren(...cards.map((card) => {
    const option = document.createElement("option");
    option.value = card.id;
    option.textContent = card.parent ? `${card.id} (adapter of ${card.parent})`
      : card.loaded === false ? `${card.id} (loads when asked)` : card.id;
    return option;
  }));
  if (cards.some((card) => card.id === chosen)) pick.value = chosen;
}

function chosenModel() {
  return $("model-pick").value || config.model;
}

// ---- conversations, kept in localStorage ----

function loadConversations() {
  try { conversations = JSON.parse(localStorage.getItem(STORE) || "[]"); } catch { conversations = []; }
  current = conversations[0] || null;
  if (!current) newConversation();
  renderConversation();
}

function saveConversations() {
  localStorage.setItem(STORE, JSON.stringify(conversations));
  renderConversationList();
}

function newConversation() {
  current = { id: Date.now().toString(36), title: "New conversation", messages: [] };
  conversations.unshift(current);
  saveConversations();
}

function renderConversationList() {
  const list = $("conversations");
  list.replaceChildren();
  for (const conversation of conversations) {
    const item = document.createElement("li");
    const open = document.createElement("button");
    open.type = "button";
    open.textContent = conversation.title;
    open.className = conversation === current ? "current" : "";
    open.addEventListener("click", () => { current = conversation; renderConversation(); });
    const remove = document.createElement("button");
    remove.type = "button";
    remove.textContent = "×";
    remove.title = "Delete";
    remove.addEventListener("click", () => deleteConversation(conversation));
    item.append(open, remove);
    list.append(item);
  }
}

function deleteConversation(conversation) {
  conversations = conversations.filter((c) => c !== conversation);
  if (current === conversation) current = conversations[0] || null;
  if (!current) newConversation();
  saveConversations();
  renderConversation();
}

function renderConversation() {
  $("messages").replaceChildren();
  for (const message of current.messages) addMessageElement(message);
  renderConversationList();
}

function addMessageElement(message) {
  const box = document.createElement("div");
  box.className = "message " + message.role;
  const content = document.createElement("div");
  content.className = "content";
  const stats = document.createElement("div");
  stats.className = "reply-stats";
  box.append(content, stats);
  $("messages").append(box);
  showMessage(box, message);
  return box;
}

function showMessage(box, message) {
  const content = box.querySelector(".content");
  if (message.role === "assistant") content.innerHTML = pagode.renderReply(message.content);  // escaped inside
  else content.textContent = message.content;
  box.querySelector(".reply-stats").textContent = message.stats || "";
  box.scrollIntoView({ block: "end" });
}

// ---- chat ----

function requestBody() {
  const messages = [];
  const system = $("system").value.trim();
  if (system) messages.push({ role: "system", content: system });
  for (const m of current.messages) if (!m.failed) messages.push({ role: m.role, content: m.content });
  return {
    ...(chosenModel() ? { model: chosenModel() } : {}), messages, stream: true, stream_options: { include_usage: true },
    temperature: Number($("temperature").value), top_p: Number($("top-p").value),
    max_tokens: Number($("max-tokens").value),
  };
}

function showError(text) {
  $("error").textContent = text;
  $("error").hidden = !text;
}

async function send() {
  const text = $("prompt").value.trim();
  if (!text || controller) return;
  showError("");
  $("prompt").value = "";
  if (current.messages.length === 0) current.title = text.slice(0, 40);
  current.messages.push({ role: "user", content: text });
  addMessageElement(current.messages[current.messages.length - 1]);
  const body = requestBody();
  $("request-json").textContent = JSON.stringify(body, null, 2);
  const reply = { role: "assistant", content: "", stats: "" };
  current.messages.push(reply);
  const box = addMessageElement(reply);
  box.classList.add("streaming");
  controller = new AbortController();
  $("stop").disabled = false;
  $("send").disabled = true;
  try {
    await streamReply(body, reply, box, controller.signal);
  } catch (error) {
    if (error.name === "AbortError") reply.stats = (reply.stats ? reply.stats + " · " : "") + "stopped";
    else { reply.failed = true; showError(error.message); }
  } finally {
    controller = null;
    $("stop").disabled = true;
    $("send").disabled = false;
    box.classList.remove("streaming");
    if (reply.failed && !reply.content) { current.messages.pop(); box.remove(); }
    else showMessage(box, reply);
    saveConversations();
  }
}

async function streamReply(body, reply, box, signal) {
  const sent = performance.now();
  const response = await fetch("/v1/chat/completions", {
    method: "POST", signal, body: JSON.stringify(body),
    headers: { "Content-Type": "application/json", ...authHeaders() },
  });
  if (!response.ok) throw new Error(await errorText(response));
  let first = null, last = null, chunks = 0, usage = null;
  await pagode.readEvents(response, ({ data }) => {
    if (data === "[DONE]") return;
    const chunk = JSON.parse(data);
    if (chunk.error) throw new Error(chunk.error.message);
    if (chunk.usage) usage = chunk.usage;
    const delta = chunk.choices && chunk.choices[0] && chunk.choices[0].delta;
    if (delta && delta.content) {
      last = performance.now();
      if (first === null) first = last;
      chunks += 1;
      reply.content += delta.content;
      reply.stats = replyStats(sent, first, last, usage ? usage.completion_tokens : chunks);
      showMessage(box, reply);
    }
  });
  reply.stats = replyStats(sent, first, last, usage ? usage.completion_tokens : chunks);
}

// TTFT from the request's start; tokens/s over the decode, from the first token to the last.
function replyStats(sent, first, last, tokens) {
  if (first === null) return "no tokens";
  const ttft = first - sent;
  const rate = last > first && tokens > 1 ? (tokens - 1) / ((last - first) / 1000) : null;
  return `TTFT ${ttft < 1000 ? ttft.toFixed(0) + " ms" : (ttft / 1000).toFixed(2) + " s"} · ` +
    `${rate === null ? "–" : rate.toFixed(1)} tok/s · ${tokens} tokens`;
}

async function errorText(response) {
  if (response.status === 401) return "The server refused the request: it needs a valid API key (type it at the top).";
  try {
    const body = await response.json();
    return `Error ${response.status}: ${body.error ? body.error.message : JSON.stringify(body)}`;
  } catch {
    return `Error ${response.status}`;
  }
}

function stop() {
  if (controller) controller.abort();  // the connection closes; the server aborts the request
}

// ---- live view ----

async function connectStats() {
  if (statsController) statsController.abort();
  if (config.auth && !apiKey()) {
    $("live-status").textContent = "Type the API key to see the live view.";
    return;
  }
  const mine = statsController = new AbortController();
  try {
    const response = await fetch("/stats/stream", { headers: authHeaders(), signal: mine.signal });
    if (!response.ok) {
      $("live-status").textContent = await errorText(response);
      return;
    }
    live.connected = true;
    $("live-status").textContent = "live";
    await pagode.readEvents(response, ({ event, data }) => applyStats(event, JSON.parse(data)));
  } catch (error) {
    if (error.name === "AbortError") return;
  } finally {
    if (statsController === mine) live.connected = false;
  }
  if (statsController === mine) {  // the server ended the stream: try again shortly
    $("live-status").textContent = "reconnecting…";
    setTimeout(() => { if (statsController === mine) connectStats(); }, 2000);
  }
}

function applyStats(event, message) {
  if (event === "snapshot") {
    live.fine = message.fine; live.coarse = message.coarse;
    live.fineLimit = 600; live.coarseLimit = 1440;
    $("model-name").textContent = message.model;  // also where a key hides /ui/config.json's
  } else {
    live.fine = live.fine.concat(message.fine).slice(-live.fineLimit);
    live.coarse = live.coarse.concat(message.coarse).slice(-live.coarseLimit);
  }
  live.signals = message.signals;
  drawSignals();
  if (!$("live-view").hidden) drawLive();
}

function drawLive() {
  const coarse = document.querySelector("input[name=range]:checked").value === "coarse";
  pagode.drawCharts(coarse ? live.coarse : live.fine, coarse ? 86400 : 600);
}

function drawSignals() {
  const box = $("signals");
  box.replaceChildren();
  for (const signal of live.signals) {
    const item = document.createElement("div");
    item.className = "signal state-" + signal.state;
    item.id = "signal-" + signal.name;
    item.dataset.state = signal.state;
    item.textContent = signal.text;
    box.append(item);
  }
}
