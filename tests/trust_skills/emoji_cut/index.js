// Shorten the title the way much JavaScript does: by UTF-16 code units.
const input = JSON.parse(process.env.SKILL_INPUT || "{}");
const title = String(input.title || "");
const max = Number(input.max || 7);
const short = title.length > max ? title.slice(0, max) : title;
console.log(JSON.stringify({ message: `Summary: ${short}`, title: short, echo: input }));
