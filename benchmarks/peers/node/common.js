// What the two BullMQ scripts share: argument parsing, the payload, and a
// process's CPU seconds read from /proc.
'use strict';

const fs = require('fs');

const PAYLOAD = { data: 'x'.repeat(256) };
const CLK_TCK = 100;

// `--some-flag value` pairs into `defaults`' keys (camelCase); numbers stay
// numbers; `--phases a b c` takes every value up to the next flag.
function parseArgs(argv, defaults) {
  const args = { ...defaults };
  for (let i = 0; i < argv.length; i++) {
    const key = argv[i].replace(/^--/, '').replace(/-([a-z])/g, (_, c) => c.toUpperCase());
    if (key === 'phases') {
      args.phases = [];
      while (i + 1 < argv.length && !argv[i + 1].startsWith('--')) args.phases.push(argv[++i]);
    } else {
      const value = argv[++i];
      args[key] = typeof args[key] === 'number' ? Number(value) : value;
    }
  }
  return args;
}

// User + system CPU seconds of process `pid` (0 when unknown or gone).
function procCpu(pid) {
  if (!pid) return 0;
  try {
    const stat = fs.readFileSync(`/proc/${pid}/stat`, 'utf8');
    const fields = stat.slice(stat.lastIndexOf(')') + 2).split(' ');
    return (Number(fields[11]) + Number(fields[12])) / CLK_TCK;
  } catch (e) {
    return 0;
  }
}

module.exports = { PAYLOAD, parseArgs, procCpu };
