// A test that cannot check says so to its runner. node's t.skip() alone
// leaves the file passing (exit 0), and ctest would show it as passed: a
// file run by ctest (`node FILE`, see tests/CMakeLists.txt) in which a test
// skipped through skipTest() and none failed exits 77 instead, ctest's
// "skipped" (SKIP_RETURN_CODE 77). A failure anywhere keeps exit 1: node's
// runner has set it by the time the process exits. Under `node --test`
// (NODE_TEST_CONTEXT set) the file is a child of that runner, which counts
// the skips itself and would take 77 for a failure: the exit code is left
// alone there.
//
//   import { skipTest } from "./lib/skip.mjs";
//   test("needs X", (t) => { if (!x) return skipTest(t, "no X here"); ... });
const skipped = [];

process.on("exit", () => {
  if (skipped.length === 0 || process.exitCode || process.env.NODE_TEST_CONTEXT) return;
  process.stderr.write(`# ${skipped.length} test(s) could not check here, so this file says skipped (exit 77):\n`);
  for (const s of skipped) process.stderr.write(`#   ${s}\n`);
  process.exitCode = 77;
});

// Marks the running test t skipped (loudly) and counts it for the exit code.
export function skipTest(t, why) {
  skipped.push(`${t.name}: ${why}`);
  process.stderr.write(`# ${t.name}: SKIPPED: ${why}\n`);
  t.skip(why);
}

// How many tests skipped so far.
export const skippedCount = () => skipped.length;
