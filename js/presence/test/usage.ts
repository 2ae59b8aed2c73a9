// Typed use of @presenced/presence by its name, as an app would write it.
// e2e/npm_test.go installs the packed package into an empty directory and
// compiles this file there with `tsc --noEmit --strict` (module resolution
// nodenext and bundler: the package's `exports` and `types` must lead tsc
// to the declarations). Each @ts-expect-error line is a mistake the
// declarations must refuse: tsc fails if one compiles.

import { PresenceClient, idProblem } from "@presenced/presence";
import type {
  ConnectionState,
  ManualStatus,
  PresenceClientOptions,
  PresenceView,
  RoomChangeDetail,
  RoomEventKind,
  RoomIntervalDetail,
  RoomMode,
  RoomView,
  StateDetail,
  Status,
  TokenSource,
  Welcome,
} from "@presenced/presence";

// The README's five lines.
const client = new PresenceClient({ token: async () => (await fetch("/my-backend/presence-token")).text() });
client.addEventListener("presence", (e) => render(e.detail));
client.start();
client.subscribe(["7", "9"]);
client.setStatus("busy", "in a meeting");

function render(v: PresenceView): string {
  const status: Status | null = v.status;
  const seen: string | null = v.last_seen;
  const version: number | null = v.version;
  return `${v.user_id} ${status ?? "hidden"} ${seen ?? ""} ${v.status_text ?? ""} ${version}`;
}

// Every way to sign in.
const sources: TokenSource[] = ["a.b.c", () => "a.b.c", async () => "a.b.c", () => Promise.resolve("a.b.c")];
const options: PresenceClientOptions[] = [
  { userId: "42" },
  { token: sources[1], url: "wss://presence.example/v1/ws", inactiveAfterMs: 30_000 },
  { token: "a.b.c", storage: null, timerWorkerURL: null },
  { token: "a.b.c", storage: localStorage, timerWorkerURL: "/assets/presence-timer.js" },
];
const clients = options.map((o) => new PresenceClient(o));

// Events and their details.
client.addEventListener("state", (e) => {
  const d: StateDetail = e.detail;
  const s: ConnectionState = d.state;
  if (s === "waiting") console.log(`retry in ${d.retryInMs ?? 0} ms`);
  if (d.code === 4003) console.log("the token expired");
});
client.addEventListener("welcome", (e) => {
  const w: Welcome = e.detail;
  console.log(w.user_id, w.device_id, w.heartbeat_interval_ms, w.ttl_ms, w.close_grace_ms);
});
client.addEventListener("servererror", (e) => {
  if (e.detail.code === "too_many_subscriptions") client.unsubscribe(["9"]);
  const room: string | undefined = e.detail.room; // a refused room message's
  const request: "join" | "leave" | "watch_room" | "unwatch_room" | undefined = e.detail.request;
  console.log(e.detail.message, room, request);
});
const onPresence = function (this: PresenceClient, e: CustomEvent<PresenceView>) {
  console.log(this.state, e.detail.user_id);
};
client.addEventListener("presence", onPresence);
client.removeEventListener("presence", onPresence);
client.addEventListener("custom", (e: Event) => console.log(e.type)); // any other event, untyped

// Rooms: who is here.
client.join("doc-42");
client.watchRoom("doc-42");
const here = new Map<string, Status | null>();
client.addEventListener("room", (e) => {
  const r: RoomView = e.detail;
  here.clear();
  for (const [id, s] of Object.entries(r.members)) here.set(id, s);
  const mode: RoomMode = r.mode;
  console.log(r.room, mode, r.count, r.partial, r.next ?? "all listed", r.version);
});
client.addEventListener("roomchange", (e) => {
  const c: RoomChangeDetail = e.detail;
  const kind: RoomEventKind = c.event;
  if (kind === "leave") here.delete(c.user_id);
  else here.set(c.user_id, c.status);
  console.log(c.room, c.count, c.version, c.snapshot ? "while away" : "live");
});
client.addEventListener("roominterval", (e) => {
  const b: RoomIntervalDetail = e.detail; // a big room: ids only
  for (const id of b.left) here.delete(id);
  for (const id of b.joined) here.set(id, null);
  console.log(b.room, b.count, b.more_joined, b.more_left, b.version, b.snapshot);
});
const room: RoomView | undefined = client.getRoom("doc-42");
const inRoom: boolean = client.rooms.has("doc-42") && client.watchedRooms.has("doc-42");
client.unwatchRoom("doc-42");
client.leave("doc-42");

// State one may read.
const view: PresenceView | undefined = client.get("7");
const watched: boolean = client.subscriptions.has("7");
const who: string | null = client.userId;
const device: string | null = client.deviceId;
const welcome: Welcome | null = client.welcome;
const statuses: ManualStatus[] = ["online", "away", "busy", "invisible"];
const problem: string = idProblem("not ok");
client.close();
client.bye();

// Mistakes the declarations refuse.
// @ts-expect-error options are required
new PresenceClient();
// @ts-expect-error a token is a string or a function that returns one
new PresenceClient({ token: 42 });
// @ts-expect-error a token function returns a token, not an object
new PresenceClient({ token: async () => ({ token: "a.b.c" }) });
// @ts-expect-error "offline" is not a status one sets
client.setStatus("offline");
// @ts-expect-error the text is a string
client.setStatus("busy", 5);
// @ts-expect-error ids are strings
client.subscribe([7, 9]);
// @ts-expect-error subscribe takes a list
client.subscribe("7");
// @ts-expect-error the view has no "online" field
client.addEventListener("presence", (e) => e.detail.online);
// @ts-expect-error a state is one of four
client.addEventListener("state", (e) => e.detail.state === "reconnecting");
// @ts-expect-error the client's state is read-only
client.state = "open";
// @ts-expect-error subscriptions change through subscribe and unsubscribe only
client.subscriptions.add("8");
// @ts-expect-error there is no such method
client.connect();
// @ts-expect-error a room is one id, not a list
client.join(["doc-42"]);
// @ts-expect-error a change is a join, a leave or a status
client.addEventListener("roomchange", (e) => e.detail.event === "kick");
// @ts-expect-error a room's mode is "events" or "interval"
client.addEventListener("room", (e) => e.detail.mode === "big");
// @ts-expect-error an interval names ids, not statuses
client.addEventListener("roominterval", (e) => e.detail.joined[0]?.status);
// @ts-expect-error rooms change through join and leave only
client.rooms.add("doc-43");

export { clients, view, watched, who, device, welcome, statuses, problem, room, inRoom };
