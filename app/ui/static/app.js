// memproxy's memory page, its views (lib.js, loaded first, has the plumbing they use).
"use strict";

// --- signing in, picking the user --------------------------------------------------------


function showLogin(message) {
  $("app").hidden = true;
  $("login").hidden = false;
  $("login-error").textContent = message || "";
  $("sign-out").hidden = true;
  $("sign-in").hidden = true;
  $("who").textContent = "";
  $("key").focus();
}

async function start() {
  for (const [names, kinds] of [["select.types", TYPES], ["select.kinds", KINDS]]) {
    for (const select of document.querySelectorAll(names)) {
      for (const type of kinds) select.append(el("option", { value: type }, type));
    }
  }
  try {
    signedIn(await json("GET", "/v1/users/me", { user: false }));
  } catch (error) {
    if (error.status === 401) showLogin(state.key ? refusal(error) : "");
    else toast(error.message, null, true);
  }
}

function signedIn(me) {
  state.role = me.role;
  $("login").hidden = true;
  $("app").hidden = false;
  $("sign-out").hidden = !state.key;
  // Where keys exist, one may open more (an admin key: every user); an open server has none.
  $("sign-in").hidden = Boolean(state.key) || me.role === "open";
  if (me.role === "user" && !me.user_id) {
    return showLogin("No user: this server needs a key bound to a user, or an admin key.");
  }
  const picks = me.role !== "user";
  $("user-form").hidden = !picks;
  $("tab-users").hidden = !picks;
  $("who").textContent = me.role === "user" ? `Signed in as ${me.user_id}`
    : me.role === "admin" ? "Admin key: any user" : "Open server (no keys): any user";
  const user = me.role === "user" ? me.user_id : sessionStorage.getItem(USER) || me.user_id;
  if (user) selectUser(user);
  else showTab("users");
  if (picks) loadUsers();
}

function selectUser(user) {
  state.user = user;
  state.offset = 0;
  if (state.role !== "user") sessionStorage.setItem(USER, user);
  $("user").value = user;
  $("wipe-confirm").value = "";
  $("wipe").disabled = true;
  // Nothing of the user shown before stays on screen (its buttons would act on this one).
  state.filter = { q: "", type: "", profile: "" };
  $("filter-form").reset();
  $("search-form").reset();
  $("search-list").replaceChildren();
  $("search-summary").textContent = "";
  document.title = `memproxy: ${user}`;
  showTab("memories");
}

// --- tabs --------------------------------------------------------------------------------

const VIEWS = { memories: loadMemories, search: null, stats: loadStats, data: null, users: loadUsers };

function showTab(name) {
  for (const tab of document.querySelectorAll("[role=tab]")) {
    const on = tab.id === `tab-${name}`;
    tab.setAttribute("aria-selected", String(on));
    tab.tabIndex = on ? 0 : -1;
    $(tab.getAttribute("aria-controls")).hidden = !on;
  }
  const load = VIEWS[name];
  if (load && (state.user || name === "users")) guarded(load)();
}

function tabKeys(event) {
  const tabs = [...document.querySelectorAll("[role=tab]")].filter((t) => !t.hidden);
  const at = tabs.indexOf(event.target);
  const step = { ArrowRight: 1, ArrowLeft: -1 }[event.key];
  if (at < 0 || !step) return;
  const next = tabs[(at + step + tabs.length) % tabs.length];
  next.focus();
  showTab(next.id.slice(4));
}

// --- memories ----------------------------------------------------------------------------

async function loadMemories() {
  const page = await json("GET", "/v1/memories", { params: {
    limit: PAGE, offset: state.offset, q: state.filter.q, type: state.filter.type,
    profile: state.filter.profile,
  } });
  if (!page.data.length && state.offset > 0) {  // the last one of the last page was deleted
    state.offset = Math.max(0, state.offset - PAGE);
    return loadMemories();
  }
  $("memory-list").replaceChildren(...page.data.map((m) => memoryItem(m)));
  const first = page.total ? state.offset + 1 : 0;
  $("list-summary").textContent = `${plural(page.total, "memory", "memories")} of ${state.user}`;
  $("page-info").textContent = `${first}–${state.offset + page.data.length} of ${page.total}`;
  $("prev").disabled = state.offset === 0;
  $("next").disabled = !page.has_more;
}

function memoryItem(memory, score) {
  const item = el("li", { class: "memory", "data-id": memory.id });
  const content = el("p", { class: "content" }, memory.content);
  const meta = el("div", { class: "meta" },
    el("span", { class: `badge type-${memory.type}` }, memory.type),
    memory.pinned ? el("span", { class: "badge pinned" }, "pinned") : null,
    memory.profile ? el("span", { class: "badge profile", title: "shown in every chat" }, "profile") : null,
    score !== undefined ? el("span", { class: "badge score" }, `score ${score.toFixed(3)}`) : null,
    linkedButton(item, memory),
    // When it was said (a history learned later, an import, an edit may date it before it was written).
    el("span", { class: "said", title: `written ${when(memory.created_at)}` },
       `${memory.source} · said ${when(memory.observed_at)} · recalled ${memory.recall_count}×`),
    el("code", { class: "id", title: "memory id" }, memory.id));
  const actions = el("div", { class: "actions" },
    el("button", { type: "button", onclick: () => editInline(item, memory) }, "Edit"),
    el("button", { type: "button", "aria-pressed": String(memory.pinned),
                   onclick: guarded(() => setPinned(item, memory)) }, memory.pinned ? "Unpin" : "Pin"),
    el("button", { type: "button", "aria-pressed": String(memory.profile),
                   title: "A standing fact about the person, shown in every chat",
                   onclick: guarded(() => setProfile(item, memory)) }, memory.profile ? "Not profile" : "Profile"),
    el("button", { type: "button", onclick: guarded(() => showHistory(memory)) }, "History"),
    el("button", { type: "button", class: "danger", onclick: guarded(() => remove(item, memory)) }, "Delete"));
  item.append(meta, content, actions);
  return item;
}

// Provenance: a fact names the user's words it was written from, an episode the facts from it.
function linkedButton(item, memory) {
  const count = (memory.linked || []).length;
  if (!count) return null;
  const label = memory.type === "episode" ? `${plural(count, "fact")} from this`
    : count === 1 ? "from your words" : `from ${count} passages of your words`;
  const button = el("button", { type: "button", class: "link linked-toggle", "aria-expanded": "false",
                                title: "Show the linked memories" }, label);
  button.addEventListener("click", guarded(() => toggleLinked(item, memory, button)));
  return button;
}

async function toggleLinked(item, memory, button) {
  const shown = item.querySelector(".linked");
  button.setAttribute("aria-expanded", String(!shown));
  if (shown) return shown.remove();
  // In place before the reads: a second click while they run hides it, and never adds another.
  const list = el("ul", { class: "linked" }, el("li", { class: "muted" }, "Loading…"));
  item.querySelector(".content").after(list);
  const found = await Promise.all(memory.linked.map((id) =>
    json("GET", `/v1/memories/${encodeURIComponent(id)}`).catch((error) => {
      if (error.status === 404) return null;  // deleted since the list was read
      throw error;
    })));
  const kept = found.filter(Boolean);
  list.replaceChildren(...(kept.length
    ? kept.map((m) => el("li", {}, el("span", { class: `badge type-${m.type}` }, m.type), " ", m.content))
    : [el("li", { class: "muted" }, "Deleted since.")]));
}

function replaceItem(item, memory) {
  const fresh = memoryItem(memory);
  item.replaceWith(fresh);
  return fresh;
}

function editInline(item, memory) {
  const text = el("textarea", { rows: "3", "aria-label": "Memory text", required: true });
  text.value = memory.content;
  const kinds = TYPES.includes(memory.type) ? TYPES : KINDS;  // an episode keeps its kind
  const type = el("select", { "aria-label": "Type" }, kinds.map((t) => el("option", { value: t }, t)));
  type.value = memory.type;
  const cancel = () => { replaceItem(form, memory).querySelector("button").focus(); };
  const form = el("form", { class: "memory editing", onsubmit: guarded(async () => {
    const changes = {};
    if (text.value.trim() !== memory.content) changes.content = text.value;
    if (type.value !== memory.type) changes.type = type.value;
    if (!Object.keys(changes).length) return cancel();
    const saved = await json("PATCH", `/v1/memories/${encodeURIComponent(memory.id)}`, { body: changes });
    replaceItem(form, saved).querySelector("button").focus();
    toast("Saved.");
  }) }, text, el("div", { class: "actions" }, type,
    el("button", { type: "submit" }, "Save"),
    el("button", { type: "button", onclick: cancel }, "Cancel")));
  form.addEventListener("keydown", (event) => {
    if (event.key === "Escape") cancel();
    if (event.key === "Enter" && (event.ctrlKey || event.metaKey)) form.requestSubmit();
  });
  item.replaceWith(form);
  text.focus();
}

async function setPinned(item, memory) {
  const saved = await json("PATCH", `/v1/memories/${encodeURIComponent(memory.id)}`,
                           { body: { pinned: !memory.pinned } });
  replaceItem(item, saved);
  toast(saved.pinned ? "Pinned: shown in every chat, never forgotten or deleted automatically." : "Unpinned.");
}

async function setProfile(item, memory) {
  const saved = await json("PATCH", `/v1/memories/${encodeURIComponent(memory.id)}`,
                           { body: { profile: !memory.profile } });
  replaceItem(item, saved);
  toast(saved.profile ? "A profile fact: shown in every chat." : "No longer a profile fact.");
}

async function remove(item, memory) {
  // A fact goes with the episodes it was written from and the memories that say the same.
  const result = await json("DELETE", `/v1/memories/${encodeURIComponent(memory.id)}`);
  const also = result.also_deleted || [];
  item.remove();
  const owner = state.user;  // another user may be selected by the time Undo is pressed
  const along = also.length ? ` and ${plural(also.length, "memory", "memories")} saying it` : "";
  toast(`Deleted “${memory.content.slice(0, 60)}”${along}.`, { label: "Undo", run: async () => {
    // Put back with their ids, texts, types, pinned states and creation dates: an import of
    // their own export lines (source and recall count kept, as an import that keeps ids keeps
    // them; their history says they were imported).
    const lines = [memory, ...also].map(({ score, ...line }) => JSON.stringify(line) + "\n");
    await api("POST", "/v1/memories/import", { raw: lines.join(""), user: owner });
    toast(`Restored to ${owner}.`);
    if (state.user === owner) await loadMemories();
  } });
  await loadMemories();
}

async function showHistory(memory) {
  const events = (await json("GET", `/v1/memories/${encodeURIComponent(memory.id)}/history`)).data;
  $("history-title").textContent = `History of ${memory.id}`;
  $("history-list").replaceChildren(...events.map((e) => el("li", {},
    el("strong", {}, e.action), ` by ${e.actor}`, e.job_id ? ` (job ${e.job_id})` : "",
    ` · ${when(e.created_at)}`,
    e.before !== null && e.action !== "created" && e.before !== e.after
      ? el("div", { class: "before" }, e.before) : null,
    e.after !== null && e.action !== "deleted" ? el("div", { class: "after" }, e.after) : null,
    e.detail ? el("div", { class: "muted" }, e.detail) : null)));
  $("history").showModal();
}

async function addMemory() {
  const body = { content: $("add-content").value, type: $("add-type").value,
                 pinned: $("add-pinned").checked, profile: $("add-profile").checked };
  const created = await json("POST", "/v1/memories", { body });
  $("add-content").value = "";
  $("add-pinned").checked = false;
  $("add-profile").checked = false;
  state.offset = 0;
  await loadMemories();
  toast(`Added ${created.id}.`);
}

// --- search ------------------------------------------------------------------------------

async function search() {
  const body = { query: $("search-query").value, limit: 20 };
  if ($("search-min").value !== "") body.min_score = Number($("search-min").value);
  const found = (await json("POST", "/v1/memories/search", { body })).data;
  $("search-summary").textContent = `${found.length} found, best first (the fused score chat recall ranks by)`;
  $("search-list").replaceChildren(...found.map((hit) => memoryItem(hit, hit.score)));
}

// --- stats and jobs ----------------------------------------------------------------------

async function loadStats() {
  const stats = await json("GET", "/v1/memories/stats");
  const rows = [
    ["Memories", stats.total],
    ...Object.entries(stats.by_type).map(([type, n]) => [`  ${type}`, n]),
    ["Pinned", stats.pinned],
    ["Profile facts", stats.profile],
    ["Recalled (times)", stats.recall_count],
    ["Oldest", when(stats.oldest)],
    ["Newest", when(stats.newest)],
    ["Jobs pending", stats.jobs.pending],
    ["Jobs failed", stats.jobs.failed],
    ["Idle work waiting", stats.jobs.idle],
  ];
  $("stats").replaceChildren(...rows.flatMap(([name, value]) => [el("dt", {}, name), el("dd", {}, value)]));
  await loadJobs();
  await loadForgotten();
}

async function loadForgotten() {
  const found = await json("GET", "/v1/memories/forgotten", { params: { limit: 100 } });
  if (!found.data.length) return $("forgotten").replaceChildren(el("li", { class: "muted" }, "Nothing forgotten."));
  $("forgotten").replaceChildren(...found.data.map((m) => el("li", { class: "memory forgotten" },
    el("p", { class: "content" }, m.content),
    el("div", { class: "meta" }, el("span", { class: "badge" }, m.type),
       m.cause !== "forgotten" ? el("span", { class: "badge" }, m.cause) : null,
       m.ended_at ? `true until ${when(m.ended_at)} · ` : null,
       `${m.cause} ${when(m.forgotten_at)} · erased after ${when(m.erased_after)}`,
       el("code", { class: "id" }, m.id)),
    el("p", { class: "muted" }, m.reason),
    el("button", { type: "button", onclick: guarded(async () => {
      await json("POST", `/v1/memories/forgotten/${encodeURIComponent(m.id)}/restore`);
      toast("Put back.");
      await loadStats();
    }) }, "Put back"))));
}

async function loadJobs() {
  const jobs = (await json("GET", "/v1/memories/jobs")).data;
  $("retry-all").disabled = !jobs.some((j) => j.status === "failed");
  if (!jobs.length) return $("jobs").replaceChildren(el("li", { class: "muted" }, "No job waiting: the Manager has learned from every chat."));
  $("jobs").replaceChildren(...jobs.map((job) => el("li", { class: `job status-${job.status}` },
    el("div", { class: "meta" }, el("span", { class: "badge" }, job.status),
       job.kind === "idle" ? el("span", { class: "badge" }, "idle upkeep") : null,
       job.kind === "history" ? el("span", { class: "badge" }, "past chats") : null,
       job.explicit ? el("span", { class: "badge" }, "asked to remember") : null,
       `${job.messages} messages · queued ${when(job.created_at)} · ${plural(job.attempts, "attempt")}`,
       el("code", { class: "id" }, job.id)),
    job.error ? el("p", { class: "error" }, job.error) : null,
    job.answer ? el("details", {}, el("summary", {}, "The Manager's answer"), el("pre", {}, job.answer)) : null,
    job.status === "failed" ? el("button", { type: "button", onclick: guarded(async () => {
      await json("POST", "/v1/memories/jobs/retry", { body: { job_id: job.id } });
      toast("Queued again.");
      await loadJobs();
    }) }, "Re-queue") : null)));
}

async function retryAll() {
  const result = await json("POST", "/v1/memories/jobs/retry", { body: {} });
  toast(`Queued again: ${result.requeued}.`);
  await loadJobs();
}

// --- import, export, delete everything ---------------------------------------------------

async function exportAll() {
  const blob = await (await api("GET", "/v1/memories/export")).blob();
  const link = el("a", { href: URL.createObjectURL(blob), download: `memories-${state.user}.jsonl` });
  document.body.append(link);
  link.click();
  link.remove();
  setTimeout(() => URL.revokeObjectURL(link.href), 1000);
}

async function importFile() {
  const file = $("import-file").files[0];
  if (!file) return;
  const ids = document.querySelector("input[name=ids]:checked").value;
  const result = await json("POST", "/v1/memories/import", { raw: await file.text(), params: { ids } });
  toast(`Imported ${result.imported}, skipped ${result.skipped} (already here).`);
  $("import-form").reset();
}

async function wipe() {
  if ($("wipe-confirm").value !== state.user) return;
  const result = await json("DELETE", "/v1/memories", { params: { confirm: "true" } });
  toast(`Deleted ${plural(result.deleted, "memory", "memories")} of ${state.user}.`);
  $("wipe-form").reset();
  $("wipe").disabled = true;
}

// --- users (admin) -----------------------------------------------------------------------

// A user id stored before ids were checked (app/proxy/user_ids.py) may pass for another: what
// could is shown as \u{...} here, so that two ids never look alike. Characters that show nothing
// (zero-width, bidi controls, odd spaces, fillers), variant forms (fullwidth, mathematical),
// accents of an id not in NFC, letters of Cyrillic, Greek, Armenian, Cherokee or Lisu beside
// Latin ones, and the letters of an id every letter of which passes for a Latin one (as the
// server's table says). Ids the rule keeps may hold Latin letters that pass for ASCII ones
// (LOOK_ASCII: "ɑ", "ǀ", small capitals, apostrophe-like letters) and marks on a Latin letter
// that NFC leaves apart ("i" with a dot above): these are shown escaped too; accented letters
// NFC composes ("é", "ö", "ñ") are shown as they are.
const BLANK = /[\p{C}\p{Z}\u115F\u1160\u3164\uFFA0\u2800\u034F\u17B4\u17B5\u180B-\u180D\uFE00-\uFE0F\u{E0100}-\u{E01EF}]/u;
const LOOK_LATIN = /^[аеорсухіјѕԁӏһԛԝԍѵүҽѡАВЕКМНОРСТУХІЈЅӀҺԚԜԌѴҮѠαικνορτυχγϲϳΑΒΕΖΗΙΚΜΝΟΡΤΥΧϹͿ]$/u;
const LOOK_ASCII = /^[ɑɡɩȷǀǁǃʼꞌᴀʙᴄᴅᴇɢʜɪᴊᴋʟᴍɴᴏᴘʀꜱᴛᴜᴠᴡʏᴢ]$/u;
const NOT_WITH_LATIN = /\p{Script=Cyrillic}|\p{Script=Greek}|\p{Script=Armenian}|\p{Script=Cherokee}|\p{Script=Lisu}/u;
const shownId = (id) => {
  const latin = /\p{Script=Latin}/u.test(id);
  const letters = [...id.normalize("NFD")].filter((c) => /\p{L}/u.test(c));
  const lookLatin = !latin && letters.length > 0 && letters.every((c) => LOOK_LATIN.test(c));
  let base = "";  // the character a mark sits on
  const odd = (c) => {
    const mark = /\p{M}/u.test(c);
    if (!mark) base = c;
    return c !== " " && (BLANK.test(c) || c.normalize("NFKC") !== c || LOOK_ASCII.test(c)
      || (mark && (id.normalize("NFC") !== id || /\p{Script=Latin}/u.test(base)))
      || ((latin || lookLatin) && NOT_WITH_LATIN.test(c)));
  };
  return [...id].map((c) => (odd(c) ? `\\u{${c.codePointAt(0).toString(16).toUpperCase()}}` : c)).join("");
};

async function loadUsers() {
  const page = await json("GET", "/v1/users", { user: false, params: { limit: PAGE, offset: state.usersOffset } });
  $("user-list").replaceChildren(...page.data.map((u) => el("option", { value: u.id })));
  $("users-summary").textContent = `${plural(page.total, "user")}, latest activity first`;
  $("users").replaceChildren(...page.data.map((u) => el("tr", {},
    el("th", { scope: "row" }, el("code", {}, shownId(u.id))), el("td", {}, u.memories), el("td", {}, when(u.last_activity)),
    el("td", {}, el("button", { type: "button", onclick: () => selectUser(u.id) }, "Open")))));
  $("users-page").textContent = `${page.total ? state.usersOffset + 1 : 0}–${state.usersOffset + page.data.length} of ${page.total}`;
  $("users-prev").disabled = state.usersOffset === 0;
  $("users-next").disabled = !page.has_more;
}

// --- wiring ------------------------------------------------------------------------------

document.addEventListener("DOMContentLoaded", () => {
  $("login-form").addEventListener("submit", guarded(async () => {
    state.key = $("key").value.trim();
    sessionStorage.setItem(KEY, state.key);
    $("key").value = "";
    try {
      signedIn(await json("GET", "/v1/users/me", { user: false }));
    } catch (error) {
      sessionStorage.removeItem(KEY);
      state.key = "";
      showLogin(error.status === 401 ? refusal(error) : error.message);
    }
  }));
  $("sign-in").addEventListener("click", () => showLogin(""));
  $("sign-out").addEventListener("click", () => {
    sessionStorage.clear();
    location.reload();
  });
  $("user-form").addEventListener("submit", (event) => {
    event.preventDefault();
    if ($("user").value.trim()) selectUser($("user").value.trim());
  });
  for (const tab of document.querySelectorAll("[role=tab]")) {
    tab.addEventListener("click", () => showTab(tab.id.slice(4)));
    tab.addEventListener("keydown", tabKeys);
  }
  $("add-form").addEventListener("submit", guarded(addMemory));
  const filter = guarded(async () => {
    state.filter = { q: $("filter-text").value.trim(), type: $("filter-type").value,
                     profile: $("filter-profile").value };
    state.offset = 0;
    await loadMemories();
  });
  $("filter-form").addEventListener("submit", filter);
  $("filter-type").addEventListener("change", filter);
  $("filter-profile").addEventListener("change", filter);
  $("prev").addEventListener("click", guarded(async () => { state.offset = Math.max(0, state.offset - PAGE); await loadMemories(); }));
  $("next").addEventListener("click", guarded(async () => { state.offset += PAGE; await loadMemories(); }));
  $("search-form").addEventListener("submit", guarded(search));
  $("refresh-stats").addEventListener("click", guarded(loadStats));
  $("retry-all").addEventListener("click", guarded(retryAll));
  $("export").addEventListener("click", guarded(exportAll));
  $("import-form").addEventListener("submit", guarded(importFile));
  $("wipe-confirm").addEventListener("input", () => { $("wipe").disabled = $("wipe-confirm").value !== state.user; });
  $("wipe-form").addEventListener("submit", guarded(wipe));
  $("refresh-users").addEventListener("click", guarded(loadUsers));
  $("users-prev").addEventListener("click", guarded(async () => { state.usersOffset = Math.max(0, state.usersOffset - PAGE); await loadUsers(); }));
  $("users-next").addEventListener("click", guarded(async () => { state.usersOffset += PAGE; await loadUsers(); }));
  start();
});
