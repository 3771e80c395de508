import process from "node:process";

const status = {
  deck: "spanish",
  counts: { due: 7, new: 12, learning: 3, suspended: 0 },
  intervals: { today: 7, tomorrow: 9, week: 31, month: 80, later: 140, total: 267, mature: 120, young: 147, buried: 2, flagged: 5, leeches: 1, average_ease: 2.5, retention: 0.91 },
};
process.stdout.write(JSON.stringify(status) + "\n");
