// gen.mjs writes vectors.json, the reference vectors of the Go tests, with the
// reference server library altcha-lib 2.8.0 and the solver code of the web
// widget altcha 3.2.2. The tests need no node: vectors.json is committed.
//
// To regenerate (node 20 or later, and the npm registry):
//
//	cd internal/altcha/testdata
//	npm install --no-package-lock      # the exact versions in package.json
//	go test -count=1 -run TestGoChallenges .. -update   # only if the Go-made challenges changed
//	node gen.mjs
//
// Nonces, salts and timings are random, so each run writes a different file
// that the tests accept alike.
//
// What it writes:
//   - v1: altcha-lib/v1 challenges (fixed salt, number, params, expiry), solved
//     by altcha-lib/v1 (libPayload) and by the widget (widgetPayload), and
//     whether altcha-lib/v1 verifies each payload.
//   - v2: altcha-lib challenges, solved by altcha-lib and by the widget, with
//     the exact string altcha-lib signs (signed) and its verification result.
//   - go: the challenges of go-challenges.json, which the Go tests make: does
//     altcha-lib verify the payload Go solved, and the widget's solution.
//
// "The widget" is the widget's own worker code (dist/workers/sha.js and
// pbkdf2.js, byte for byte the workers its main bundle embeds) run here under
// a stand-in for a Web Worker's `self`, plus the widget's conversion of a v1
// challenge and payload, copied below from dist/main/altcha.js.
import fs from 'node:fs';
import * as lib from 'altcha-lib';
import * as libV1 from 'altcha-lib/v1';
import { deriveKey as pbkdf2 } from 'altcha-lib/algorithms/pbkdf2';
import { deriveKey as sha } from 'altcha-lib/algorithms/sha';
import { canonicalJSON } from './node_modules/altcha-lib/dist/esm/v2/helpers.js';

const HMAC_KEY = 'flashsale-altcha-test-key-0123456789'; // altcha_test.go: testKey
const FAR = 4102444800; // 2100-01-01T00:00:00Z
const PAST = 978307200; // 2001-01-01T00:00:00Z

const here = new URL('.', import.meta.url);
const version = (p) => JSON.parse(fs.readFileSync(new URL(`node_modules/${p}/package.json`, here))).version;
for (const [p, v] of [['altcha-lib', '2.8.0'], ['altcha', '3.2.2']]) {
	if (version(p) !== v) throw new Error(`${p} ${version(p)} installed, want ${v}`);
}

// The widget's worker for an algorithm, as its main bundle picks it.
const workerSource = (algorithm) =>
	fs.readFileSync(new URL(`node_modules/altcha/dist/workers/${algorithm.startsWith('PBKDF2/') ? 'pbkdf2' : 'sha'}.js`, here), 'utf8');

// widgetSolve posts the message the widget's solveChallengeWorkers posts to
// its one worker (counterStart 0, counterStep 1).
function widgetSolve(challenge, counterMode) {
	return new Promise((resolve, reject) => {
		const self = { postMessage: (d) => (d && d.error ? reject(d.error) : d ? resolve(d) : reject(new Error('no solution'))) };
		new Function('self', workerSource(challenge.parameters.algorithm))(self);
		self.onmessage({ data: { type: 'work', challenge, counterMode, counterStart: 0, counterStep: 1, timeout: 120000 } });
	});
}

// ---- Copied from altcha 3.2.2 dist/main/altcha.js (createChallengeFromV1, createPayloadV1, bufferToHex).
function bufferToHex(buffer) {
	return Array.from(new Uint8Array(buffer)).map((b) => b.toString(16).padStart(2, '0')).join('');
}
function createChallengeFromV1(challenge) {
	const [_, queryParams] = challenge.salt.split('?');
	const data = {};
	if (queryParams) {
		try {
			Object.assign(data, Object.fromEntries(new URLSearchParams(queryParams).entries()));
		} catch {}
	}
	const result = {
		codeChallenge: challenge.codeChallenge,
		parameters: {
			algorithm: challenge.algorithm,
			cost: 1,
			data,
			expiresAt: data?.expires ? parseInt(data.expires, 10) : void 0,
			keyLength: challenge.algorithm === 'SHA-512' ? 64 : challenge.algorithm === 'SHA-384' ? 48 : 32,
			nonce: bufferToHex(new TextEncoder().encode(challenge.salt)),
			keyPrefix: challenge.challenge,
			salt: '',
		},
		signature: challenge.signature,
	};
	Object.defineProperties(result, {
		_originalSalt: { enumerable: false, value: challenge.salt, writable: false },
		_version: { enumerable: false, value: 1, writable: false },
	});
	return result;
}
function createPayloadV1(challenge, solution) {
	return {
		algorithm: challenge.parameters.algorithm,
		challenge: challenge.parameters.keyPrefix,
		number: solution.counter,
		salt: '_originalSalt' in challenge ? challenge._originalSalt : challenge.parameters.nonce,
		signature: challenge.signature,
		took: solution.time || 0,
	};
}
// ---- End of the copy.

// What the widget does with a challenge JSON it fetched, up to the payload
// it puts in its form field (verify() in dist/main/altcha.js).
async function widget(challengeJSON) {
	let challenge = JSON.parse(challengeJSON);
	const v1 = typeof challenge === 'object' && 'challenge' in challenge;
	if (v1) challenge = createChallengeFromV1(challenge);
	const solution = await widgetSolve(challenge, v1 ? 'string' : 'uint32');
	const payload = v1
		? createPayloadV1(challenge, solution)
		: { challenge: { parameters: challenge.parameters, signature: challenge.signature }, solution };
	return btoa(JSON.stringify(payload));
}

// What altcha-lib's framework plugins do with a payload (frameworks/shared.js).
async function libVerify(payload) {
	const p = JSON.parse(atob(payload));
	if (typeof p.challenge === 'string') return libV1.verifySolution(payload, HMAC_KEY);
	const deriveKey = p.challenge.parameters.algorithm.startsWith('PBKDF2/') ? pbkdf2 : sha;
	const r = await lib.verifySolution({ challenge: p.challenge, solution: p.solution, deriveKey, hmacSignatureSecret: HMAC_KEY });
	return r.verified;
}

const v1Cases = [
	{ name: 'bound', salt: 'a1b2c3d4e5f60718293a4b5c', params: { buyer: 'buyer-42', sku: 'SKU-1001' }, expires: FAR, number: 4242, maxnumber: 100000, want: 'ok' },
	{ name: 'escaping', salt: '00ff00ff00ff00ff00ff00ff', params: { note: 'a b*c~d"e\\f<g>&h=i?j+k%l;m', sku: 'X' }, expires: FAR, number: 77, maxnumber: 1000, want: 'ok' },
	{ name: 'random salt', params: { sku: 'SKU-7' }, expires: FAR, number: 31337, maxnumber: 1000000, want: 'ok' },
	{ name: 'expired', salt: '0123456789abcdef01234567', params: { buyer: 'b', sku: 's' }, expires: PAST, number: 10, maxnumber: 100, want: 'expired' },
];

const v2Cases = [
	{ name: 'pbkdf2 bound', algorithm: 'PBKDF2/SHA-256', cost: 1000, counter: 123, data: { buyer: 'buyer-42', sku: 'SKU-1001' }, expiresAt: FAR, want: 'ok' },
	{ name: 'pbkdf2 random prefix 00', algorithm: 'PBKDF2/SHA-256', cost: 500, data: { sku: 'SKU-2' }, expiresAt: FAR, want: 'ok' },
	{ name: 'sha-256 escaping', algorithm: 'SHA-256', cost: 100, counter: 400, data: { note: 'q"uo\\te <b>&amp; ~*', sku: 'X' }, expiresAt: FAR, want: 'ok' },
	{ name: 'pbkdf2 no data', algorithm: 'PBKDF2/SHA-256', cost: 200, counter: 9, expiresAt: FAR, want: 'ok' },
	{ name: 'expired', algorithm: 'PBKDF2/SHA-256', cost: 100, counter: 5, data: { buyer: 'b', sku: 's' }, expiresAt: PAST, want: 'expired' },
];

const out = { generator: 'testdata/gen.mjs', altchaLib: version('altcha-lib'), altcha: version('altcha'), node: process.version, hmacKey: HMAC_KEY, v1: [], v2: [], go: [] };

for (const c of v1Cases) {
	const challenge = await libV1.createChallenge({ hmacKey: HMAC_KEY, salt: c.salt, params: c.params, expires: new Date(c.expires * 1000), number: c.number, maxnumber: c.maxnumber });
	const solved = await libV1.solveChallenge(challenge.challenge, challenge.salt, challenge.algorithm, challenge.maxnumber).promise;
	const { algorithm, salt, signature } = challenge;
	const libPayload = btoa(JSON.stringify({ algorithm, challenge: challenge.challenge, number: solved.number, salt, signature, took: solved.took }));
	const widgetPayload = await widget(JSON.stringify(challenge));
	out.v1.push({
		...c, saltPrefix: challenge.salt.split('?')[0], challenge,
		libPayload, libPayloadLibVerified: await libVerify(libPayload),
		widgetPayload, widgetPayloadLibVerified: await libVerify(widgetPayload),
	});
}

for (const c of v2Cases) {
	const deriveKey = c.algorithm.startsWith('PBKDF2/') ? pbkdf2 : sha;
	const challenge = await lib.createChallenge({ algorithm: c.algorithm, cost: c.cost, counter: c.counter, data: c.data, expiresAt: c.expiresAt, deriveKey, hmacSignatureSecret: HMAC_KEY });
	const solution = await lib.solveChallenge({ challenge, deriveKey });
	const libPayload = btoa(JSON.stringify({ challenge, solution }));
	const widgetPayload = await widget(JSON.stringify(challenge));
	out.v2.push({
		...c, challenge, signed: canonicalJSON(challenge.parameters),
		libPayload, libPayloadLibVerified: await libVerify(libPayload),
		widgetPayload, widgetPayloadLibVerified: await libVerify(widgetPayload),
	});
}

for (const g of JSON.parse(fs.readFileSync(new URL('go-challenges.json', here)))) {
	const widgetPayload = await widget(JSON.stringify(g.challenge));
	out.go.push({
		name: g.name, challenge: g.challenge,
		goPayloadLibVerified: await libVerify(g.payload),
		widgetPayload, widgetPayloadLibVerified: await libVerify(widgetPayload),
	});
}

fs.writeFileSync(new URL('vectors.json', here), JSON.stringify(out, null, '\t') + '\n');
console.log(`vectors.json: ${out.v1.length} v1, ${out.v2.length} v2, ${out.go.length} Go-made`);
