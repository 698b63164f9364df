// A session's whole transcript as a file the browser saves: Markdown to read, JSON to keep.
// History is paged from the newest back (oldest first within a page); the file is built in
// the page and handed over as a blob, so nothing new is asked of the server.

const PAGE = 100;

export async function exportSession(rpc, session, format) {
  const messages = [];
  let before;
  do {
    const params = { sessionKey: session.sessionKey, limit: PAGE };
    if (before) params.before = before;
    const page = await rpc.call("sessions.history", params);
    messages.unshift(...page.messages);
    before = page.next || null;
  } while (before);
  const { body, type, ext } = format === "json"
    ? { body: JSON.stringify({ session, messages }, null, 2), type: "application/json", ext: "json" }
    : { body: markdown(session, messages), type: "text/markdown", ext: "md" };
  const url = URL.createObjectURL(new Blob([body], { type: `${type};charset=utf-8` }));
  const a = document.createElement("a");
  a.href = url;
  a.download = `${fileName(session.title)}.${ext}`;
  document.body.append(a);
  a.click();
  a.remove();
  setTimeout(() => URL.revokeObjectURL(url), 1000);
}

function markdown(session, messages) {
  const lines = [`# ${session.title}`, ""];
  for (const m of messages) {
    lines.push(`## ${m.role === "user" ? "You" : m.role === "assistant" ? "Assistant" : m.role} · ${m.ts}`, "", m.content, "");
  }
  return lines.join("\n");
}

function fileName(title) {
  return (title || "session").replace(/[^\p{L}\p{N} _-]+/gu, "").trim().replace(/\s+/g, "-").slice(0, 60) || "session";
}
