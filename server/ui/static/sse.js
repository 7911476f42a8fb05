"use strict";
// Server-sent events over fetch (not EventSource, which cannot send an Authorization
// header): read the body stream, split it into events on blank lines, hand each on.
window.pagode = window.pagode || {};

pagode.readEvents = async function (response, onEvent) {
  const reader = response.body.getReader();
  const decoder = new TextDecoder();
  let buffer = "";
  for (;;) {
    const { value, done } = await reader.read();
    if (done) break;
    buffer += decoder.decode(value, { stream: true }).replace(/\r\n?/g, "\n");
    let end;
    while ((end = buffer.indexOf("\n\n")) >= 0) {
      const block = buffer.slice(0, end);
      buffer = buffer.slice(end + 2);
      const event = pagode.parseEvent(block);
      if (event) onEvent(event);
    }
  }
};

pagode.parseEvent = function (block) {
  let name = "message";
  const data = [];
  for (const line of block.split("\n")) {
    if (line.startsWith(":")) continue;  // a comment: sse-starlette's pings
    const colon = line.indexOf(":");
    const field = colon < 0 ? line : line.slice(0, colon);
    let value = colon < 0 ? "" : line.slice(colon + 1);
    if (value.startsWith(" ")) value = value.slice(1);
    if (field === "event") name = value;
    else if (field === "data") data.push(value);
  }
  return data.length ? { event: name, data: data.join("\n") } : null;
};
