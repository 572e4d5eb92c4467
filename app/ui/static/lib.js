// memproxy's memory page, its plumbing: the page's state, building elements, calling the
// memory API (/v1/memories, /v1/users) with the key, and the messages shown. app.js has the views.
// Every text from the server is put in the page with textContent, never as HTML.
"use strict";

const TYPES = ["fact", "preference", "knowledge", "event", "correction", "feedback"];
const KINDS = [...TYPES, "episode"];  // an episode (the user's own words) is listed, not added
const PAGE = 20;
const KEY = "memproxy.key";
const USER = "memproxy.user";
const state = { key: sessionStorage.getItem(KEY) || "", role: null, user: "", offset: 0,
                usersOffset: 0, filter: { q: "", type: "", profile: "" } };

const ROOT = new URL("..", location.href);  // the page is at <root>/ui/: works under a prefix
const $ = (id) => document.getElementById(id);

function el(tag, attrs, ...children) {
  const node = document.createElement(tag);
  for (const [name, value] of Object.entries(attrs || {})) {
    if (name.startsWith("on")) node.addEventListener(name.slice(2), value);
    else if (value === true) node.setAttribute(name, "");
    else if (value !== false && value !== null && value !== undefined) node.setAttribute(name, value);
  }
  for (const child of children.flat()) {
    if (child !== null && child !== undefined) node.append(child instanceof Node ? child : String(child));
  }
  return node;
}

function plural(count, word, words) {
  return `${count} ${count === 1 ? word : words || word + "s"}`;
}

function when(iso) {
  return iso ? new Date(iso).toLocaleString() : "never";
}

// --- the API -----------------------------------------------------------------------------

class ApiError extends Error {
  constructor(status, message, code) { super(message); this.status = status; this.code = code; }
}

// `user`: act for the selected user (true), for this one (a string: e.g. where a deleted memory
// came from), or for no user (false: routes that span users).
async function api(method, path, { body, raw, params, user = true } = {}) {
  const url = new URL(path.slice(1), ROOT);
  if (user && state.role !== "user") url.searchParams.set("user", user === true ? state.user : user);
  for (const [name, value] of Object.entries(params || {})) {
    if (value !== undefined && value !== null && value !== "") url.searchParams.set(name, value);
  }
  const headers = {};
  if (state.key) headers.Authorization = `Bearer ${state.key}`;
  let payload;
  if (raw !== undefined) {
    payload = raw;
    headers["Content-Type"] = "application/x-ndjson";
  } else if (body !== undefined) {
    payload = JSON.stringify(body);
    headers["Content-Type"] = "application/json";
  }
  const response = await fetch(url, { method, headers, body: payload });
  if (!response.ok) {
    let message = `${response.status} ${response.statusText}`;
    let code = null;
    try {
      const error = (await response.json()).error;
      message = error.message + (error.param ? ` (${error.param})` : "");
      code = error.code;
    } catch (_) { /* not JSON: keep the status line */ }
    throw new ApiError(response.status, message, code);
  }
  return response;
}

const json = async (...args) => (await api(...args)).json();

function refusal(error) {
  return error.code === "invalid_api_key" ? "The key was refused." : error.message;
}

// An event handler that reports what went wrong: a refused key opens the sign-in form again.
function guarded(action) {
  return async (event) => {
    if (event && event.preventDefault) event.preventDefault();
    try {
      await action(event);
    } catch (error) {
      if (error.status === 401) return showLogin(refusal(error));
      toast(error.message, null, true);
    }
  };
}

// --- messages ----------------------------------------------------------------------------

let toastTimer = null;

function toast(message, action, isError) {
  const box = $("toast");
  box.replaceChildren(el("span", {}, message));
  box.classList.toggle("error", Boolean(isError));
  if (action) box.append(el("button", { type: "button", onclick: guarded(async () => {
    box.hidden = true;
    await action.run();
  }) }, action.label));
  box.hidden = false;
  clearTimeout(toastTimer);
  toastTimer = setTimeout(() => { box.hidden = true; }, action ? 10000 : 5000);
}
