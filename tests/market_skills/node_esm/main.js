import { describe } from "./lib/describe.js";

const input = JSON.parse(process.env.SKILL_INPUT || "{}");
const { default: isOdd } = await import("is-odd");
console.log(JSON.stringify({ ok: true, message: describe(input.n), odd: isOdd(input.n) }));
