// Checks presence.d.ts against the JSDoc types of presence.js, which
// `tsc --checkJs --strict` checks against the code: a declaration that
// says something the code does not fails to compile. e2e/npm_test.go
// compiles it with `tsc --noEmit --strict --allowJs` in a directory laid
// out as
//
//   package.json          {"type": "module"}
//   conformance.ts        this file
//   impl/presence.js      the code (its types: its JSDoc)
//   decl/presence.d.ts    the declarations (decl/presence.js resolves to it)

import * as impl from "./impl/presence.js";
import type * as decl from "./decl/presence.js";

// Same<A, B> is true only when A and B are the same type.
type Same<A, B> = (<T>() => T extends A ? 1 : 2) extends <T>() => T extends B ? 1 : 2 ? true : false;
function same<_ extends true>(): void {}

// The types of the data.
same<Same<decl.ManualStatus, impl.ManualStatus>>();
same<Same<decl.Status, impl.Status>>();
same<Same<decl.ConnectionState, impl.ConnectionState>>();
same<Same<decl.TokenSource, impl.TokenSource>>();
same<Same<decl.WebSocketConstructor, impl.WebSocketConstructor>>();
same<Same<decl.PresenceView, impl.PresenceView>>();
same<Same<decl.Welcome, impl.Welcome>>();
same<Same<decl.StateDetail, impl.StateDetail>>();
same<Same<decl.ServerErrorDetail, impl.ServerErrorDetail>>();
same<Same<decl.RoomView, impl.RoomView>>();
same<Same<decl.RoomEventKind, impl.RoomEventKind>>();
same<Same<decl.RoomChangeDetail, impl.RoomChangeDetail>>();
same<Same<decl.RoomMode, impl.RoomMode>>();
same<Same<decl.RoomIntervalDetail, impl.RoomIntervalDetail>>();
same<Same<decl.PresenceClientOptions, impl.PresenceClientOptions>>();
// The events: the code dispatches them only through _emit, whose type and
// detail come from its PresenceClientEventMap.
same<Same<decl.PresenceClientEventMap, impl.PresenceClientEventMap>>();

// The client: what the declarations promise, the code has, with the very
// same types (method parameters compared exactly, not bivariantly).
type D = decl.PresenceClient;
type I = impl.PresenceClient;
same<Same<ConstructorParameters<typeof decl.PresenceClient>, [opts: decl.PresenceClientOptions]>>();
same<Same<NonNullable<ConstructorParameters<typeof impl.PresenceClient>[0]>, impl.PresenceClientOptions>>();
same<Same<D["start"], I["start"]>>();
same<Same<D["subscribe"], I["subscribe"]>>();
same<Same<D["unsubscribe"], I["unsubscribe"]>>();
same<Same<D["setStatus"], I["setStatus"]>>();
same<Same<D["bye"], I["bye"]>>();
same<Same<D["close"], I["close"]>>();
same<Same<D["get"], I["get"]>>();
same<Same<D["join"], I["join"]>>();
same<Same<D["leave"], I["leave"]>>();
same<Same<D["watchRoom"], I["watchRoom"]>>();
same<Same<D["unwatchRoom"], I["unwatchRoom"]>>();
same<Same<D["getRoom"], I["getRoom"]>>();
same<Same<D["userId"], I["userId"]>>();
same<Same<D["token"], I["token"]>>();
same<Same<D["url"], I["url"]>>();
same<Same<D["inactiveAfterMs"], I["inactiveAfterMs"]>>();
same<Same<D["deviceId"], I["deviceId"]>>();
same<Same<D["welcome"], I["welcome"]>>();
same<Same<D["state"], I["state"]>>();
same<Same<D["subscriptions"], ReadonlySet<string>>>();
const subscriptions: D["subscriptions"] = {} as I["subscriptions"];
same<Same<D["rooms"], ReadonlySet<string>>>();
const rooms: D["rooms"] = {} as I["rooms"];
same<Same<D["watchedRooms"], ReadonlySet<string>>>();
const watchedRooms: D["watchedRooms"] = {} as I["watchedRooms"];
// And the class as a whole: the code's class is a value of the declared one.
const Client: typeof decl.PresenceClient = impl.PresenceClient;

same<Same<typeof decl.idProblem, typeof impl.idProblem>>();

// The module exports nothing else, and nothing declared is missing.
same<Same<keyof typeof decl, keyof typeof impl>>();

export { subscriptions, rooms, watchedRooms, Client };
