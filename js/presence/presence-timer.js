// presence-timer.js — timers for presence.js in a dedicated worker, where
// browsers do not throttle them as they do the timers of a hidden page.
// Message {id, ms} starts a timer that posts id back; {id, cancel: true}
// stops it.
const timers = new Map();
onmessage = (e) => {
  const { id, ms, cancel } = e.data;
  clearTimeout(timers.get(id));
  timers.delete(id);
  if (cancel) return;
  timers.set(
    id,
    setTimeout(() => {
      timers.delete(id);
      postMessage(id);
    }, ms),
  );
};
