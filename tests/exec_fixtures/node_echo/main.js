const input = JSON.parse(process.env.SKILL_INPUT || "{}");
const ctx = JSON.parse(process.env.SKILL_CONTEXT || "{}");
console.log(JSON.stringify({ok: true, doubled: (input.n || 0) * 2, role: ctx.role_id, argv: process.argv.slice(2)}));
