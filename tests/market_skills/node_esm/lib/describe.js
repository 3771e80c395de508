import isOdd from "is-odd";

export function describe(n) {
  return `${n} is ${isOdd(n) ? "odd" : "even"}`;
}
