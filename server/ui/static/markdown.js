"use strict";
// Model output is untrusted. Everything is escaped first; the renderer then only adds tags
// of its own (code blocks, inline code, bold, italic, lists, paragraphs) around text that
// is already escaped, so no character the model sent can open a tag or an attribute.
window.pagode = window.pagode || {};

pagode.escapeHtml = function (text) {
  return text.replace(/&/g, "&amp;").replace(/</g, "&lt;").replace(/>/g, "&gt;")
    .replace(/"/g, "&quot;").replace(/'/g, "&#39;");
};

function renderInline(escaped) {
  // Inline code first, so that ** inside backticks stays literal.
  const parts = escaped.split(/(`[^`\n]+`)/);
  return parts.map((part, i) => {
    if (i % 2 === 1) return "<code>" + part.slice(1, -1) + "</code>";
    return part.replace(/\*\*([^*\n]+)\*\*/g, "<strong>$1</strong>")
      .replace(/(^|[^*])\*([^*\n]+)\*(?!\*)/g, "$1<em>$2</em>");
  }).join("");
}

function renderBlocks(escaped) {
  const out = [];
  let list = null;
  let paragraph = [];
  const flushParagraph = () => {
    if (paragraph.length) out.push("<p>" + paragraph.map(renderInline).join("<br>") + "</p>");
    paragraph = [];
  };
  const flushList = () => {
    if (list) out.push("<" + list.tag + ">" + list.items.map((it) => "<li>" + renderInline(it) + "</li>").join("") + "</" + list.tag + ">");
    list = null;
  };
  for (const line of escaped.split("\n")) {
    const bullet = /^\s*[-*+]\s+(.*)$/.exec(line);
    const numbered = /^\s*\d+[.)]\s+(.*)$/.exec(line);
    const heading = /^(#{1,6})\s+(.*)$/.exec(line);
    if (bullet || numbered) {
      flushParagraph();
      const tag = bullet ? "ul" : "ol";
      if (list && list.tag !== tag) flushList();
      if (!list) list = { tag, items: [] };
      list.items.push((bullet || numbered)[1]);
    } else if (heading) {
      flushParagraph(); flushList();
      out.push("<h4>" + renderInline(heading[2]) + "</h4>");
    } else if (line.trim() === "") {
      flushParagraph(); flushList();
    } else {
      flushList();
      paragraph.push(line);
    }
  }
  flushParagraph(); flushList();
  return out.join("");
}

// Markdown of already-escaped text: fenced code blocks (closed or still streaming) are cut
// out first and shown as they are.
function renderMarkdown(text) {
  const escaped = pagode.escapeHtml(text);
  const pieces = escaped.split(/```/);
  return pieces.map((piece, i) => {
    if (i % 2 === 0) return renderBlocks(piece);
    const newline = piece.indexOf("\n");
    const lang = newline > 0 ? piece.slice(0, newline).trim() : "";
    const code = newline >= 0 ? piece.slice(newline + 1) : piece;
    return "<pre class=\"code\"" + (lang && /^[\w+-]+$/.test(lang) ? " data-lang=\"" + lang + "\"" : "") + "><code>" + code + "</code></pre>";
  }).join("");
}

// A reply, with reasoning (<think>...</think>, still open while it streams) folded away.
pagode.renderReply = function (text) {
  const start = text.indexOf("<think>");
  if (start < 0) return renderMarkdown(text);
  const end = text.indexOf("</think>", start);
  const thought = text.slice(start + 7, end < 0 ? text.length : end);
  const rest = text.slice(0, start) + (end < 0 ? "" : text.slice(end + 8));
  return "<details class=\"think\"><summary>" + (end < 0 ? "Thinking…" : "Reasoning") +
    "</summary>" + renderMarkdown(thought.trim()) + "</details>" + renderMarkdown(rest.trim());
};
