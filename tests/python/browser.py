"""A headless Debian chromium, driven through Selenium and /usr/bin/chromedriver, for the
console's tests (tests/it/console_web.rs): the Rust test sends one JSON command per line on
stdin and reads one JSON answer per line on stdout, so it can act on the edge (connect a
node, start a run) between browser steps.

Commands (`op`): open {url}; wait_text {css, text} (until an element matching css holds
text); wait_gone {css}; click {css}; type {css, text}; text {css}; count {css};
set_storage {key, value} (sessionStorage); size {width, height}; screenshot {path}; quit.
Reads and clicks that meet an element a refresh replaced meanwhile look again.
Answers: {"ok": true, "value": ...} or {"ok": false, "error": "..."}. Every wait is
bounded by PATIENCE seconds. Selenium Manager is never used: the driver is Debian's.
"""

import json
import shutil
import sys
import tempfile

from selenium import webdriver
from selenium.common.exceptions import StaleElementReferenceException, WebDriverException
from selenium.webdriver.chrome.service import Service
from selenium.webdriver.common.by import By
from selenium.webdriver.support.ui import WebDriverWait

PATIENCE = 20
CHROMEDRIVER = "/usr/bin/chromedriver"


def browser(profile):
    options = webdriver.ChromeOptions()
    options.binary_location = shutil.which("chromium") or "/usr/bin/chromium"
    for flag in (
        "--headless=new",
        "--no-sandbox",
        "--disable-dev-shm-usage",
        "--disable-gpu",
        "--no-proxy-server",
        "--disable-background-networking",
        "--disable-component-update",
        "--disable-default-apps",
        "--disable-sync",
        "--no-first-run",
        "--hide-scrollbars",
        "--force-color-profile=srgb",
        f"--user-data-dir={profile}",
        "--window-size=1280,900",
    ):
        options.add_argument(flag)
    return webdriver.Chrome(service=Service(executable_path=CHROMEDRIVER), options=options)


def has_text(driver, css, text):
    for element in driver.find_elements(By.CSS_SELECTOR, css):
        try:
            if text in element.text:
                return element.text
        except WebDriverException:
            pass  # replaced while read: look again
    return False


def clicked(driver, css):
    """Clicks the first shown, enabled match; False when there is none yet, or a refresh
    replaced it between finding and clicking."""
    try:
        for element in driver.find_elements(By.CSS_SELECTOR, css):
            if element.is_displayed() and element.is_enabled():
                element.click()
                return True
    except StaleElementReferenceException:
        pass
    return False


def text_of(driver, css):
    """The first matching element's text, or False when a refresh replaced it while read."""
    try:
        return [driver.find_element(By.CSS_SELECTOR, css).text]
    except StaleElementReferenceException:
        return False


def run(driver, command):
    op = command["op"]
    wait = WebDriverWait(driver, PATIENCE, poll_frequency=0.05)
    if op == "open":
        driver.get(command["url"])
        return None
    if op == "wait_text":
        css, text = command["css"], command["text"]
        return wait.until(lambda d: has_text(d, css, text), f"{css} to show {text!r}")
    if op == "wait_gone":
        css = command["css"]
        wait.until(lambda d: not d.find_elements(By.CSS_SELECTOR, css), f"{css} to go")
        return None
    if op == "click":
        css = command["css"]
        wait.until(lambda d: clicked(d, css), f"{css} to be clickable")
        return None
    if op == "type":
        element = wait.until(lambda d: d.find_element(By.CSS_SELECTOR, command["css"]))
        element.clear()
        element.send_keys(command["text"])
        return None
    if op == "text":
        css = command["css"]
        return wait.until(lambda d: text_of(d, css), f"{css} to be read")[0]
    if op == "count":
        return len(driver.find_elements(By.CSS_SELECTOR, command["css"]))
    if op == "set_storage":
        driver.execute_script("sessionStorage.setItem(arguments[0], arguments[1])",
                              command["key"], command["value"])
        return None
    if op == "size":
        driver.set_window_size(command["width"], command["height"])
        return None
    if op == "screenshot":
        driver.save_screenshot(command["path"])
        return None
    raise ValueError(f"unknown op {op!r}")


def main():
    profile = tempfile.mkdtemp(prefix="edge-console-chromium-")
    driver = browser(profile)
    try:
        print(json.dumps({"ok": True, "value": "ready"}), flush=True)
        for line in sys.stdin:
            command = json.loads(line)
            if command["op"] == "quit":
                break
            try:
                answer = {"ok": True, "value": run(driver, command)}
            except Exception as error:  # reported to the test, which fails with it
                answer = {"ok": False, "error": f"{type(error).__name__}: {error}"}
            print(json.dumps(answer), flush=True)
    finally:
        driver.quit()
        shutil.rmtree(profile, ignore_errors=True)


if __name__ == "__main__":
    main()
