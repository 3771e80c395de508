#!/usr/bin/env node
const input = JSON.parse(process.env.SKILL_INPUT || "{}");
const duration = Number(input.duration_sec || 10);
const fps = Number(input.fps || 24);
const frames = Math.round(duration * fps);
console.error(`computing ${frames} frames`);
console.log(JSON.stringify({
  ok: true,
  clip: input.clip || "clip.mp4",
  fps,
  duration_sec: duration,
  frames,
  keyframes: [0, Math.round(frames / 2), frames - 1],
}));
