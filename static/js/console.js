/* Lazaretto console: live regions never destroy what the operator is doing.

   A live region re-renders itself by polling (hx-trigger="every 2s [...]",
   hx-swap="outerHTML"): every swap throws away the checkboxes ticked for the
   bulk form, the caret in a field, keyboard focus and any row form whose post
   is still under way. Each live region therefore asks, in its trigger filter,

     hx-trigger="every 2s [document.visibilityState === 'visible' && liveRegionIdle(this)]"

   and polling pauses while the operator is in the middle of something inside
   it; it resumes on the next tick once they are done (boxes unticked, focus
   gone, request answered), and new rows appear again.

   Why pause rather than keep the selection across swaps (hx-preserve, or
   re-ticking saved ids after htmx:afterSwap): a paused table is the only
   state in which everything survives (ticks, typed text, caret, focus, an
   open <select>, a row post in flight) without a rule per kind of control;
   rows do not shift under the pointer while the operator picks them, so a
   click never lands on a row that moved in since; and the bulk form posts
   exactly the rows the operator sees ticked, never one re-ticked from a saved
   id the new table no longer shows. The price, a table that waits while
   boxes are ticked, is what the operator wants while they choose.

   How htmx 2 (the copy django-htmx bundles) runs the filter: it compiles the
   bracketed expression once with Function(), calls it with `this` bound to
   the polling element and the poll event as `event`, and reads each bare name
   (`document`, `liveRegionIdle`) from the event first, then from `window`;
   hence this function is a global. A filter that throws counts as false (no
   request, an htmx:eventFilter:error in the console): if this file failed to
   load, the table would stop refreshing rather than wipe a selection.

   Without JavaScript nothing polls and nothing here runs: the checkboxes are
   plain form controls of the bulk form (form="bulk-form"). */
(function () {
  'use strict'

  // Controls whose focus means the operator is typing or choosing.
  const EDITING = 'textarea, select, input:not([type=checkbox]):not([type=radio])' +
    ':not([type=button]):not([type=submit]):not([type=reset]):not([type=hidden])'

  function keyboardFocused (element) {
    try {
      return element.matches(':focus-visible')
    } catch (error) { // a browser without :focus-visible
      return false
    }
  }

  // The element with focus is inside the region and the operator is using it:
  // typing or choosing in a field, or moving through the rows with the
  // keyboard. A link or box merely clicked with the mouse keeps focus in
  // Chromium; that does not count, or a ctrl-clicked link (opened in a new
  // tab) or a box ticked and unticked would freeze the table until the next
  // click elsewhere.
  function focusInside (region) {
    const active = document.activeElement
    if (!active || active === region || !region.contains(active)) return false
    return active.matches(EDITING) || keyboardFocused(active)
  }

  // A control that no longer shows what the server rendered: a ticked (or
  // unticked) box, typed text, another option chosen.
  function changed (control) {
    if (control.type === 'checkbox' || control.type === 'radio') {
      return control.checked !== control.defaultChecked
    }
    if (control.tagName === 'SELECT') {
      const options = Array.from(control.options)
      if (control.multiple) return options.some((o) => o.selected !== o.defaultSelected)
      const initial = options.findIndex((o) => o.defaultSelected)
      return control.selectedIndex !== (initial === -1 ? 0 : initial)
    }
    return control.value !== control.defaultValue // hidden inputs: always equal
  }

  function liveRegionIdle (region) {
    if (focusInside(region)) return false
    // A row form's own htmx post (Release, Fail, Purge) still under way: its
    // answer replaces its row, which a swap of the region would detach.
    if (region.querySelector('.htmx-request')) return false
    // Ticked boxes (the bulk form's selection: form="bulk-form"), typed text.
    return !Array.from(region.querySelectorAll('input, select, textarea')).some(changed)
  }

  window.liveRegionIdle = liveRegionIdle

  // The filter runs when the poll is sent; its answer comes back a round trip
  // later. A box ticked in between must survive too: a live region's own
  // refresh is not swapped in while the region is busy (the next tick asks
  // again). Other requests that target a region (the filter form, "Older")
  // are the operator's own doing and swap as usual.
  document.addEventListener('htmx:beforeSwap', function (event) {
    const detail = event.detail
    const region = detail.target
    if (!region || detail.elt !== region) return
    if (!(region.getAttribute('hx-trigger') || '').includes('liveRegionIdle')) return
    if (!liveRegionIdle(region)) detail.shouldSwap = false
  })
})()
