// ES module `import` of a bare package name falls back to the NODE_PATH folders, as
// CommonJS `require` does. Node skills with a dependency environment run with
// `node --import <this file>` (jobs/execution/envs.py), so a skill written as ESM (`.mjs`,
// or "type": "module") finds its cached node_modules without any file in its own folder.
import * as mod from "node:module";
import path from "node:path";
import { pathToFileURL } from "node:url";
import { isMainThread } from "node:worker_threads";

if (isMainThread && typeof mod.register === "function") {
  const dirs = (process.env.NODE_PATH || "").split(path.delimiter).filter(Boolean);
  mod.register(import.meta.url, { data: { dirs } });
}

// A module inside the folder that holds each node_modules: resolving "as if imported from
// there" searches that node_modules (NODE_PATH entries not named node_modules are skipped).
let parents = [];

export function initialize(data) {
  parents = (data?.dirs || [])
    .filter((dir) => path.basename(dir) === "node_modules")
    .map((dir) => pathToFileURL(path.join(path.dirname(dir), "noop.js")).href);
}

const BARE = /^(?![./]|#|[a-zA-Z][a-zA-Z0-9+.-]*:)/;

export async function resolve(specifier, context, next) {
  try {
    return await next(specifier, context);
  } catch (err) {
    if (err?.code !== "ERR_MODULE_NOT_FOUND" || !BARE.test(specifier)) throw err;
    for (const parentURL of parents) {
      try {
        return await next(specifier, { ...context, parentURL });
      } catch {
        // not in this folder either: try the next, else the original error
      }
    }
    throw err;
  }
}
