import isNumber from "is-number";

const input = JSON.parse(process.env.SKILL_INPUT || "{}");
console.log(JSON.stringify({ ok: true, value: input.value, is_number: isNumber(input.value) }));
